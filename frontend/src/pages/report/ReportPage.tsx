/** The deployment report: per device, every variant measured, and the recommendation. */
import { lazy, Suspense } from 'react';
import { Link, useNavigate, useParams } from 'react-router';
import { ApiError } from '../../api/client';
import { isTerminal, useCanWrite, useJob, useReport, useRerunJob } from '../../api/hooks';
import type { Report, ReportDevice, SensitivityRow, Tolerance } from '../../api/types';
import { EmptyState, ErrorMessage, Loading, PageHeader, StatusBadge } from '../../components/common';
import { capabilitySummary } from '../../components/capabilities';
import { toleranceText } from '../../components/tolerance';
import { formatMs, formatNumber } from '../../format';
import { decisionOf, headline, provisionalBadge, ratioWords, tieBadge } from './verdict';
import { kindLabel } from '../../components/outputKinds';
import { CalibrationSubset } from './CalibrationSubset';
import { LearningCurves } from './LearningCurves';
import { PerStepAccuracy } from './PerStepAccuracy';
import { ReportTable, variantLabel } from './ReportTable';

const ReportCharts = lazy(() => import('./ReportCharts'));

export function Recommendation({ device, onRemeasure }: { device: ReportDevice; onRemeasure?: () => void }) {
  const variant = device.variants.find((candidate) => candidate.id === device.recommended);
  if (!variant) {
    return (
      <div className="alert alert-warn" data-testid="recommendation">
        No recommendation for this device. {headline(device)}
        <WhyNotTable device={device} />
      </div>
    );
  }
  const provisional = device.final === false;
  const decision = decisionOf(device);
  const badge = decision ? tieBadge(decision) : null;
  const busy = decision ? provisionalBadge(decision) : null;
  return (
    <div className="recommendation" data-testid="recommendation">
      <div>
        <span className="badge badge-recommended">{provisional ? 'Best so far' : 'Recommended'}</span>{' '}
        <strong data-testid="recommended-label">{decision?.label ?? variantLabel(variant)}</strong>
        {provisional ? <span className="muted small"> · still measuring; this page updates by itself</span> : null}
      </div>
      {decision?.speed || decision?.cost || badge || busy ? (
        <ul className="verdict-facts" aria-label="Verdict">
          {decision?.speed ? <li data-testid="verdict-speedup">{decision.speed}</li> : null}
          {decision?.cost ? <li data-testid="verdict-cost">{decision.cost}</li> : null}
          {badge ? <li><span className="badge badge-tie">{badge}</span></li> : null}
          {busy ? (
            <li>
              <span className="badge badge-warn" title={decision?.provisional?.text} data-testid="provisional-badge">
                {busy}
              </span>
            </li>
          ) : null}
        </ul>
      ) : null}
      <p className="recommendation-reason" data-testid="verdict">{headline(device)}</p>
      <div className="button-row">
        {variant.artifact?.download_url ? (
          <a className="button button-primary button-small" href={variant.artifact.download_url} download data-testid="recommended-download">
            Download recommended artifact
          </a>
        ) : null}
        {device.package ? (
          <a className="button button-small" href={device.package.download_url} download data-testid="package-download">
            Download deployment package
          </a>
        ) : null}
      </div>
      <NoiseNote device={device} onRemeasure={onRemeasure} />
      <SideBySide device={device} />
      <WhyNotTable device={device} />
    </div>
  );
}

/** The device's timing noise, told once: unstable first passes, windows re-taken while the device was busy, what the decision rests on. */
export function NoiseNote({ device, onRemeasure }: { device: ReportDevice; onRemeasure?: () => void }) {
  const noise = decisionOf(device)?.noise;
  if (!noise?.text) return null;
  const warn = (noise.busy ?? 0) > 0 || ((noise.unstable ?? 0) > 0 && !decisionOf(device)?.measurement);
  return (
    <div className={`${warn ? 'alert alert-warn' : 'muted small'} noise-note`} role="note" data-testid="noise-note">
      <strong>Timing on this device.</strong> {noise.text}
      {warn && onRemeasure ? (
        <>
          {' '}
          <button type="button" className="button button-small" onClick={onRemeasure} data-testid="remeasure">
            Re-measure (run this deployment again)
          </button>
        </>
      ) : null}
    </div>
  );
}

/** The finalists timed side by side: the rounds, why they stopped, and each finalist's per-round ratio against the recommended. */
export function SideBySide({ device }: { device: ReportDevice }) {
  const measurement = decisionOf(device)?.measurement;
  if (!measurement || measurement.finalists.length === 0) return null;
  return (
    <details className="side-by-side" data-testid="side-by-side">
      <summary>
        Timed side by side: {measurement.finalists.length} finalists, {measurement.rounds} rounds
        {measurement.stopped_text ? ` (${measurement.stopped_text})` : ''}
      </summary>
      <div className="table-wrap">
        <table className="table">
          <thead>
            <tr>
              <th scope="col">Finalist</th>
              <th scope="col" className="numeric">p50</th>
              <th scope="col">Recommended against it</th>
              <th scope="col">Per round</th>
            </tr>
          </thead>
          <tbody>
            {measurement.finalists.map((row) => (
              <tr key={row.variant} data-testid="side-by-side-row">
                <th scope="row">{row.label}</th>
                <td className="numeric">{formatMs(row.p50_ms)}</td>
                <td>
                  {row.against_recommended ? `${ratioWords(row.against_recommended)}: ${row.against_recommended.comparison}` : 'recommended'}
                </td>
                <td className="muted small">
                  {(row.against_recommended?.per_round ?? []).map((ratio) => ratio.toFixed(2)).join(' · ')}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </details>
  );
}

/** Why not the others: one row per precision family (its best showing) and one per failed build or task, each with why. */
export function WhyNotTable({ device }: { device: ReportDevice }) {
  const rows = decisionOf(device)?.alternatives ?? [];
  if (rows.length === 0) return null;
  return (
    <div className="table-wrap why-not">
      <table className="table" data-testid="why-not">
        <caption className="muted small">Why not the others (the best of each precision family, and every failure)</caption>
        <thead>
          <tr>
            <th scope="col">Family</th>
            <th scope="col">Best of it</th>
            <th scope="col" className="numeric">p50</th>
            <th scope="col">Why not</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((row) => (
            <tr key={`${row.family}-${row.variant ?? ''}-${row.build ?? ''}`} data-outcome={row.outcome}>
              <th scope="row">{row.family}</th>
              <td>
                {row.label}
                {row.variants > 1 ? <span className="muted small"> (best of {row.variants})</span> : null}
              </td>
              <td className="numeric">{formatMs(row.p50_ms)}</td>
              <td>{row.why}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** What the `auto` search did: its rounds and the nodes that quantize worst. */
export function SearchSummary({ report }: { report: Report }) {
  const search = report.search;
  // Filled or absent: an `auto` search always says what its rounds tried and why families were kept or dropped.
  if (!search || (!search.auto && search.sensitivity.length === 0)) return null;
  const kept = new Set(
    report.devices.flatMap((device) => {
      const chosen = device.variants.find((variant) => variant.id === device.recommended);
      const excluded = chosen?.options?.nodes_to_exclude;
      return Array.isArray(excluded) ? (excluded as string[]) : [];
    }),
  );
  const notes = Object.entries(search.notes ?? {}).filter(([, lines]) => lines.length > 0);
  const tried = search.tried ?? [];
  return (
    <section className="card" aria-labelledby="search-heading" data-testid="search-summary">
      <h2 id="search-heading">Quantization search</h2>
      <p className="muted">
        {search.rounds} round{search.rounds === 1 ? '' : 's'} of candidates measured on the devices
        {search.budget_minutes ? `, within a budget of ${search.budget_minutes} minutes` : ''}.
        {search.stopped ? ` The search stopped early: ${search.stopped}.` : ''}
      </p>
      {tried.length > 0 ? (
        <ol className="search-rounds" data-testid="search-rounds">
          {tried.map((round) => (
            <li key={round.round}>
              <strong>Round {round.round}:</strong>{' '}
              {round.variants.map((variant, index) => (
                <span key={variant.key} className={variant.status === 'failed' || variant.status === 'skipped' ? 'muted' : undefined}
                  title={variant.error || undefined}>
                  {index > 0 ? ', ' : ''}
                  {variant.key}
                  {variant.effective_precision && !variant.key.startsWith(variant.effective_precision) ? ` (${variant.effective_precision})` : ''}
                  {variant.status === 'failed' ? ' (build failed)' : variant.status === 'skipped' ? ' (not applicable)' : ''}
                </span>
              ))}
            </li>
          ))}
        </ol>
      ) : null}
      {notes.length > 0 ? (
        <div data-testid="search-notes">
          <h3 className="small">Why families were searched or dropped</h3>
          {notes.map(([target, lines]) => (
            <ul key={target} aria-label={`Search notes for ${target}`}>
              {lines.map((line) => (
                <li key={line}>{line}</li>
              ))}
            </ul>
          ))}
        </div>
      ) : null}
      {search.sensitivity.length > 0 ? (
        <>
          <p className="muted small">
            Nodes ranked by how much INT8 hurts their output (lowest SQNR first); the recommended variant keeps the marked ones in float.
          </p>
          <table className="table" data-testid="sensitivity-table">
            <thead>
              <tr>
                <th scope="col">Node</th>
                <th scope="col">Op type</th>
                <th scope="col" className="numeric">SQNR (dB)</th>
                <th scope="col">In the recommendation</th>
              </tr>
            </thead>
            <tbody>
              {search.sensitivity.slice(0, 10).map((row) => (
                <tr key={row.node}>
                  <td><code>{row.node}</code></td>
                  <td>{row.op_type}</td>
                  <td className="numeric">{row.sqnr_db.toFixed(1)}</td>
                  <td>{kept.has(row.node) ? <span className="badge">kept in float</span> : 'quantized'}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      ) : search.sensitivity_note ? (
        <p className="muted small" data-testid="sensitivity-note">{search.sensitivity_note}</p>
      ) : null}
    </section>
  );
}

/** Regressions against earlier measurements of the same variant on this device, and the latency estimate's error. */
export function DeviceFindings({ device }: { device: ReportDevice }) {
  const regressions = device.variants.filter((variant) => variant.regression?.flagged);
  const estimate = device.estimate;
  if (regressions.length === 0 && !estimate) return null;
  return (
    <div className="stack">
      {regressions.map((variant) => (
        <div key={variant.id} className="alert alert-warn" role="status" data-testid="regression">
          <strong className="regression">Regression:</strong> {variantLabel(variant)} is {formatNumber(variant.regression?.slowdown ?? null, 2)}x slower than in{' '}
          <Link to={`/jobs/${variant.regression?.baseline_job}/report`}>deployment #{variant.regression?.baseline_job}</Link> (p50{' '}
          {formatNumber(variant.regression?.baseline_p50_ms ?? null, 3)} → {formatNumber(variant.latency_ms?.p50 ?? null, 3)} ms), beyond the measured noise.
        </div>
      ))}
      {estimate ? (
        <p className="muted small estimate-note" data-testid="estimate-error">
          {estimate.estimated_p50_ms !== null && estimate.error !== null
            ? `Estimated before measuring: FP32 ${formatNumber(estimate.estimated_p50_ms, 3)} ms on ${estimate.backend}; measured ${formatNumber(estimate.measured_p50_ms, 3)} ms (error ${estimate.error >= 0 ? '+' : ''}${Math.round(estimate.error * 100)}%, from ${estimate.models} other model${estimate.models === 1 ? '' : 's'}).`
            : `No estimate before measuring: ${estimate.note ?? 'no other model was measured on this device.'}`}
        </p>
      ) : null}
    </div>
  );
}

/** For a re-run: what differed from the job it repeats. */
export function RerunSummary({ report }: { report: Report }) {
  const rerun = report.rerun;
  if (!rerun) return null;
  return (
    <section className="card" aria-labelledby="rerun-heading" data-testid="rerun-summary">
      <h2 id="rerun-heading">
        Re-run of <Link to={`/jobs/${rerun.job}/report`}>deployment #{rerun.job}</Link>
      </h2>
      {rerun.differences.length === 0 ? (
        <p className="muted">Same toolchain versions on the host and the devices.</p>
      ) : (
        <ul data-testid="rerun-differences">
          {rerun.differences.map((line) => (
            <li key={line}>{line}</li>
          ))}
        </ul>
      )}
      {rerun.latency.length > 0 ? (
        <table className="table">
          <thead>
            <tr>
              <th scope="col">Variant</th>
              <th scope="col">Device</th>
              <th scope="col" className="numeric">p50 before</th>
              <th scope="col" className="numeric">p50 now</th>
              <th scope="col" className="numeric">Ratio</th>
            </tr>
          </thead>
          <tbody>
            {rerun.latency.map((row) => (
              <tr key={`${row.variant_key}-${row.backend}-${row.agent}`}>
                <td>{row.variant_key} on {row.backend}</td>
                <td>{row.agent}</td>
                <td className="numeric">{formatNumber(row.before_p50_ms, 3)} ms</td>
                <td className="numeric">{formatNumber(row.after_p50_ms, 3)} ms</td>
                <td className={`numeric${row.regression ? ' regression' : ''}`}>{formatNumber(row.ratio, 2)}x{row.regression ? ' (regression)' : ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </section>
  );
}

/** How each output is judged, from the job's evaluation plan. */
export function OutputsJudged({ report }: { report: Report }) {
  const outputs = report.evaluation?.outputs ?? [];
  if (outputs.length === 0) return null;
  return (
    <p className="muted small" data-testid="outputs-judged">
      Judged by:{' '}
      {outputs.map((output, index) => (
        <span key={output.name}>
          {index > 0 ? '; ' : ''}
          <code>{output.name}</code> as {kindLabel(output.kind)}
          {output.primary ? ' (primary)' : ''}
        </span>
      ))}
    </p>
  );
}

/** What FP32 scores against itself on this device: the noise floor a tolerance is read against. */
export function Fp32Noise({ device }: { device: ReportDevice }) {
  const rows = device.fp32_noise ?? [];
  if (rows.length === 0) return null;
  return (
    <p className="muted small" data-testid="fp32-noise">
      FP32 noise on this device:{' '}
      {rows.map((row, index) => (
        <span key={row.backend}>
          {index > 0 ? '; ' : ''}
          {row.backend} {row.metric} {row.value === null ? '—' : row.value.toFixed(4)}
          {row.drop === null || row.drop === undefined ? '' : row.drop === 0 ? ' (no drop)' : ` (drop ${Math.abs(row.drop) >= 1e-3 ? formatNumber(row.drop, 4) : row.drop.toExponential(1)})`}
        </span>
      ))}
    </p>
  );
}

function DeviceSection({ device, tolerance, onRemeasure, sensitivity, sensitivityNote, jobId }: {
  device: ReportDevice; tolerance: Tolerance; onRemeasure?: () => void; sensitivity?: SensitivityRow[]; sensitivityNote?: string; jobId?: number;
}) {
  const name = device.agent?.name ?? device.target ?? 'Device';
  return (
    <section className="device-report" aria-label={`Results on ${name}`} data-testid="device-report">
      <div className="card">
        <div className="section-header">
          <div>
            <h2>{name}</h2>
            {device.agent ? <p className="muted small">{capabilitySummary(device.agent.capabilities)}</p> : null}
          </div>
        </div>
        <Recommendation device={device} onRemeasure={onRemeasure} />
        <DeviceFindings device={device} />
        <Fp32Noise device={device} />
        {device.variants.length === 0 ? (
          <EmptyState title="No variant has finished on this device yet." />
        ) : (
          <ReportTable variants={device.variants} recommended={device.recommended} deviceName={name} jobId={jobId} />
        )}
      </div>
      {device.variants.length > 0 ? (
        <Suspense fallback={<Loading label="Loading charts…" />}>
          <ReportCharts device={device} tolerance={tolerance} sensitivity={sensitivity} sensitivityNote={sensitivityNote} />
        </Suspense>
      ) : null}
      <LearningCurves variants={device.variants} />
      <PerStepAccuracy variants={device.variants} />
    </section>
  );
}

export function ReportPage() {
  const jobId = Number(useParams().jobId);
  const report = useReport(jobId);
  // A 404 report means "not ready" only when the job itself exists (another tenant's job is a 404 too).
  const job = useJob(jobId);
  const rerun = useRerunJob(jobId);
  const navigate = useNavigate();
  const canWrite = useCanWrite();
  const remeasure = canWrite && report.data?.status && isTerminal(report.data.status)
    ? () => rerun.mutate(undefined, { onSuccess: (created) => navigate(`/jobs/${created.id}`) })
    : undefined;

  const header = (
    <PageHeader
      documentTitle={`Report for deployment #${jobId}`}
      title={<>Report for deployment #{jobId} {report.data ? <StatusBadge status={report.data.status} /> : null}</>}
      subtitle={
        <>
          <Link to={`/jobs/${jobId}`}>Back to the deployment</Link>
          {report.data ? (
            <>
              {' '}
              · tolerance: {toleranceText(report.data.tolerance)}
            </>
          ) : null}
        </>
      }
    />
  );

  if (report.isPending) return <>{header}<Loading /></>;
  if (report.isError) {
    const notReady = report.error instanceof ApiError && report.error.status === 404 && !!job.data;
    return (
      <>
        {header}
        {notReady ? (
          <EmptyState title="The report is not ready yet.">It appears when the devices have reported their results.</EmptyState>
        ) : (
          <ErrorMessage error={job.isError ? job.error : report.error} />
        )}
      </>
    );
  }
  return (
    <>
      {header}
      <OutputsJudged report={report.data} />
      <CalibrationSubset datasets={report.data.datasets} />
      {report.data.devices.length === 0 ? (
        <EmptyState title="No device has reported yet.">Results show up here as each device finishes its tasks.</EmptyState>
      ) : (
        report.data.devices.map((device, index) => (
          <DeviceSection key={device.agent?.id ?? device.target ?? index} device={device} tolerance={report.data.tolerance} onRemeasure={remeasure} sensitivity={report.data.search?.sensitivity ?? []}
            sensitivityNote={report.data.search?.sensitivity_note} jobId={report.data.job} />
        ))
      )}
      <RerunSummary report={report.data} />
      <SearchSummary report={report.data} />
    </>
  );
}
