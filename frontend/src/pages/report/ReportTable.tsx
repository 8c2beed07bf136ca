/** The per-device table of variants: sortable, with the recommended variant highlighted. */
import { useState } from 'react';
import type { AccuracyResult, ReportVariant } from '../../api/types';
import { StatusBadge } from '../../components/common';
import { CsvButton } from '../../components/csv';
import { formatBytes, formatMs, formatNumber } from '../../format';

type SortValue = number | string | boolean | null | undefined;

interface Column {
  key: string;
  label: string;
  numeric?: boolean;
  /** 2 or 3: the column hides on narrower screens (3 first), and comes back in the stacked cards of a phone. */
  priority?: 2 | 3;
  value: (variant: ReportVariant) => SortValue;
  render: (variant: ReportVariant) => React.ReactNode;
}

export function priorityClass(column: { priority?: 2 | 3; numeric?: boolean }): string | undefined {
  const classes = [column.numeric ? 'numeric' : '', column.priority ? `col-p${column.priority}` : ''].filter(Boolean);
  return classes.length ? classes.join(' ') : undefined;
}

export function variantLabel(variant: ReportVariant): string {
  // The server's label names what runs first (kiln_contract/labels.py); reports stored before labels name the recipe key.
  return variant.label ?? `${variant.key ?? variant.precision} · ${variant.backend}`;
}

function formatDrop(drop: number | null | undefined): string {
  if (drop === null || drop === undefined) return '—';
  const sign = drop > 0 ? '−' : drop < 0 ? '+' : '';
  return `${sign}${formatNumber(Math.abs(drop), 4)}`;
}

export const COLUMNS: Column[] = [
  {
    key: 'precision',
    label: 'Variant',
    value: (v) => v.key ?? v.precision,
    render: (v) => (
      <>
        <strong className="variant-precision">{v.effective_precision ?? v.precision}</strong> <span className="muted small">{v.backend}</span>
        {v.key && v.key !== (v.effective_precision ?? v.precision) ? <div className="muted small variant-key">{v.key}{v.round && v.round > 1 ? ` · round ${v.round}` : ''}</div> : null}
      </>
    ),
  },
  {
    key: 'p50',
    label: 'Latency p50',
    numeric: true,
    value: (v) => v.latency_ms?.p50,
    render: (v) => (
      <>
        {formatMs(v.latency_ms?.p50)}
        {v.timing?.source === 'side by side' ? (
          // The row's figures are the side-by-side rounds alone; the first pass is another measurement set, shown apart.
          <span className="muted small block" title="Every figure of this row comes from the side-by-side rounds" data-testid="side-by-side-mark">
            side by side · first pass {formatMs((v.first_pass?.latency_ms ?? v.latency_ms_first_pass)?.p50)}
          </span>
        ) : null}
      </>
    ),
  },
  { key: 'p99', label: 'p99', numeric: true, priority: 3, value: (v) => v.latency_ms?.p99, render: (v) => formatMs(v.latency_ms?.p99) },
  {
    key: 'throughput',
    label: 'Throughput',
    numeric: true,
    priority: 3,
    value: (v) => v.throughput_per_s,
    render: (v) => (v.throughput_per_s === null || v.throughput_per_s === undefined ? '—' : `${formatNumber(v.throughput_per_s, 1)}/s`),
  },
  { key: 'size', label: 'Size', numeric: true, priority: 2, value: (v) => v.size_bytes, render: (v) => formatBytes(v.size_bytes) },
  {
    key: 'accuracy',
    label: 'Accuracy',
    numeric: true,
    value: (v) => v.accuracy?.value,
    render: (v) => <AccuracyCell accuracy={v.accuracy} />,
  },
  { key: 'drop', label: 'Drop', numeric: true, value: (v) => v.accuracy?.drop, render: (v) => formatDrop(v.accuracy?.drop) },
  {
    key: 'within',
    label: 'In tolerance',
    value: (v) => v.accuracy?.within_tolerance,
    render: (v) =>
      v.accuracy?.within_tolerance === true ? (
        <StatusBadge status="succeeded" label="Yes" />
      ) : v.accuracy?.within_tolerance === false ? (
        <StatusBadge status="failed" label="No" />
      ) : (
        <span className="muted">—</span>
      ),
  },
];

/** Every metric that could not be measured, by output: a failing plugin, labels that fit nothing. */
export function accuracyErrors(accuracy: AccuracyResult | null | undefined): string[] {
  const outputs = (accuracy?.outputs ?? {}) as Record<string, { errors?: Record<string, string> }>;
  const errors = Object.entries(outputs).flatMap(([output, result]) =>
    Object.entries(result?.errors ?? {}).map(([metric, message]) => `${output} ${metric}: ${message}`),
  );
  const labels = accuracy?.labels as { error?: string } | null | undefined;
  if (labels?.error) errors.push(labels.error);
  return errors;
}

function AccuracyCell({ accuracy }: { accuracy: AccuracyResult | null }) {
  const errors = accuracyErrors(accuracy);
  const where = accuracy?.output ? ` on ${String(accuracy.output)}` : '';
  return (
    <span>
      {accuracy?.value === null || accuracy?.value === undefined ? (
        <span className="muted" title={String(accuracy?.reason ?? 'not measured')}>
          —
        </span>
      ) : (
        <span title={`${accuracy.metric}${where}`}>{formatNumber(accuracy.value, 4)}</span>
      )}
      {accuracy?.metric ? <span className="muted small block">{accuracy.metric}</span> : null}
      {errors.length > 0 ? (
        <span className="field-error small block" title={errors.join('\n')} data-testid="accuracy-errors">
          {errors.length} metric error{errors.length === 1 ? '' : 's'}
        </span>
      ) : null}
    </span>
  );
}

function compare(a: SortValue, b: SortValue): number {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  if (typeof a === 'boolean' && typeof b === 'boolean') return Number(b) - Number(a);
  return String(a).localeCompare(String(b));
}

/** Sorts variants by a column; variants without a value always go last, whatever the direction. */
export function sortVariants(variants: ReportVariant[], key: string, direction: 'ascending' | 'descending'): ReportVariant[] {
  const column = COLUMNS.find((candidate) => candidate.key === key) ?? COLUMNS[1];
  const sign = direction === 'ascending' ? 1 : -1;
  return [...variants].sort((left, right) => {
    const a = column.value(left);
    const b = column.value(right);
    const aMissing = a === null || a === undefined;
    const bMissing = b === null || b === undefined;
    if (aMissing || bMissing) return Number(aMissing) - Number(bMissing);
    return sign * compare(a, b) || left.id - right.id;
  });
}

export function reportCsvName(jobId: number | undefined, deviceName: string): string {
  return `kiln-report${jobId ? `-job-${jobId}` : ''}-${deviceName.replace(/[^A-Za-z0-9._-]+/g, '-')}.csv`;
}

export function ReportTable({
  variants,
  recommended,
  deviceName,
  jobId,
}: {
  variants: ReportVariant[];
  recommended: number | null;
  deviceName: string;
  /** Names the CSV file: two exports of one device from two jobs must not overwrite each other. */
  jobId?: number;
}) {
  const [sort, setSort] = useState<{ key: string; direction: 'ascending' | 'descending' }>({ key: 'p50', direction: 'ascending' });
  const sorted = sortVariants(variants, sort.key, sort.direction);
  // A column with nothing in it is only width: throughput is often not measured.
  const columns = COLUMNS.filter((column) => column.key !== 'throughput' || variants.some((variant) => column.value(variant) !== null && column.value(variant) !== undefined));

  const toggle = (key: string) =>
    setSort((previous) =>
      previous.key === key
        ? { key, direction: previous.direction === 'ascending' ? 'descending' : 'ascending' }
        : { key, direction: 'ascending' },
    );

  return (
    <>
    <div className="table-tools">
      <CsvButton
        filename={reportCsvName(jobId, deviceName)}
        header={['variant', 'precision', 'effective_precision', 'backend', 'p50_ms', 'timing', 'first_pass_p50_ms', 'p99_ms', 'throughput_per_s', 'size_bytes',
          'accuracy_metric', 'accuracy', 'drop', 'within_tolerance', 'unstable', 'recommended']}
        rows={sorted.map((v) => [v.key ?? v.precision, v.precision, v.effective_precision ?? v.precision, v.backend, v.latency_ms?.p50, v.timing?.source ?? null,
          v.latency_ms_first_pass?.p50 ?? null, v.latency_ms?.p99, v.throughput_per_s, v.size_bytes,
          v.accuracy?.metric, v.accuracy?.value, v.accuracy?.drop, v.accuracy?.within_tolerance, v.unstable ?? null, v.id === recommended])}
      />
    </div>
    <div className="table-wrap">
      <table className="table report-table table-cards" data-testid="report-table">
        <caption className="visually-hidden">Variants measured on {deviceName}. Column headers sort the table.</caption>
        <thead>
          <tr>
            {columns.map((column) => (
              <th
                key={column.key}
                scope="col"
                aria-sort={sort.key === column.key ? sort.direction : 'none'}
                className={priorityClass(column)}
              >
                <button type="button" className="sort-button" onClick={() => toggle(column.key)}>
                  {column.label}
                  <span className="sort-indicator" aria-hidden="true">
                    {sort.key === column.key ? (sort.direction === 'ascending' ? '▲' : '▼') : '↕'}
                  </span>
                </button>
              </th>
            ))}
            <th scope="col">
              <span className="visually-hidden">Artifact</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {sorted.map((variant) => {
            const isRecommended = variant.id === recommended;
            return (
              <tr
                key={variant.id}
                className={`${isRecommended ? 'row-recommended' : ''}${variant.status === 'failed' ? ' row-failed' : ''}`}
                data-testid={isRecommended ? 'recommended-row' : 'variant-row'}
                data-variant-id={variant.id}
                aria-current={isRecommended ? 'true' : undefined}
              >
                {columns.map((column, index) => (
                  <td key={column.key} className={priorityClass(column)} data-label={index === 0 ? '' : column.label}>
                    {column.render(variant)}
                    {index === 0 && isRecommended ? (
                      <span className="badge badge-recommended" data-testid="recommended-badge">
                        Recommended
                      </span>
                    ) : null}
                    {index === 0 && variant.pareto && !isRecommended ? (
                      <span className="badge badge-neutral" title="On the speed/accuracy Pareto front">
                        Pareto
                      </span>
                    ) : null}
                    {index === 0 && variant.unstable ? (
                      <span className="badge badge-warn" title="Its first-pass timing windows disagreed by more than 10% (see Timing on this device)">
                        Unstable
                      </span>
                    ) : null}
                    {index === 0 && variant.busy ? (
                      <span className="badge badge-warn" title="Timed while other processes kept the device busy, after re-taking the window" data-testid="busy-badge">
                        Busy
                      </span>
                    ) : null}
                    {index === 0 && variant.error ? <div className="field-error small">{variant.error}</div> : null}
                  </td>
                ))}
                <td data-label="" className="cell-actions">
                  {variant.artifact?.download_url ? (
                    <a
                      className="button button-small"
                      href={variant.artifact.download_url}
                      download
                      aria-label={`Download ${variantLabel(variant)} for ${deviceName}`}
                      data-testid="variant-download"
                    >
                      Download
                    </a>
                  ) : null}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
    </>
  );
}
