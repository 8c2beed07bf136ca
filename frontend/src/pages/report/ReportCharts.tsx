/**
 * The report's charts, loaded on demand: latency against accuracy with the tolerance line
 * (uPlot, ~23 kB gzipped, instead of recharts at ~127 kB), and time per operator type.
 */
import { useEffect, useId, useMemo, useRef, useState } from 'react';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import type { ReportDevice, ReportVariant, Tolerance } from '../../api/types';
import { BarList } from '../../components/BarList';
import { formatNumber } from '../../format';
import { variantLabel } from './ReportTable';

const COLORS = { good: '#2f6f4f', bad: '#b04a3a', outside: '#9a8f85', recommended: '#b4532a', grid: '#ebe6df', axis: '#6b6259' };

/** Figures where a smaller value is better (an error, not an agreement). */
export const LOWER_IS_BETTER = ['relative_l2', 'cer'];

function verdictMetric(device: ReportDevice, tolerance: Tolerance): string {
  return device.variants.find((variant) => variant.accuracy?.metric)?.accuracy?.metric ?? tolerance.metric;
}

/** The accuracy value a variant must reach: the FP32 reference minus the allowed drop (plus, for error figures). */
export function toleranceThreshold(device: ReportDevice, tolerance: Tolerance): number | null {
  if (tolerance.metric === 'sqnr') return tolerance.min_value ?? null;
  const lower = LOWER_IS_BETTER.includes(verdictMetric(device, tolerance));
  const withReference = device.variants.find(
    (variant) => typeof variant.accuracy?.reference_value === 'number' && Number.isFinite(variant.accuracy.reference_value),
  );
  const fp32 = device.variants.find((variant) => variant.precision === 'fp32' && typeof variant.accuracy?.value === 'number');
  const reference = withReference?.accuracy?.reference_value ?? fp32?.accuracy?.value ?? null;
  if (reference === null || reference === undefined || !Number.isFinite(reference)) return null;
  return lower ? reference + (tolerance.max_drop ?? 0) : reference - (tolerance.max_drop ?? 0);
}

/** Mounts a uPlot chart that follows its container's width. */
function UPlot({ options, data, label, testId }: { options: Omit<uPlot.Options, 'width'>; data: uPlot.AlignedData; label: string; testId: string }) {
  const container = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const element = container.current;
    if (!element) return undefined;
    const plot = new uPlot({ ...options, width: element.clientWidth || 560 } as uPlot.Options, data, element);
    const observer =
      typeof ResizeObserver === 'undefined'
        ? null
        : new ResizeObserver(() => plot.setSize({ width: element.clientWidth || 560, height: options.height }));
    observer?.observe(element);
    return () => {
      observer?.disconnect();
      plot.destroy();
    };
  }, [options, data]);
  return <div ref={container} className="uplot-host" role="img" aria-label={label} data-testid={testId} />;
}

function scatterPoint(size: number, fill: string): uPlot.Series.Points {
  return { show: true, size, fill, stroke: fill, width: 1 };
}

export function LatencyAccuracyScatter({ device, tolerance }: { device: ReportDevice; tolerance: Tolerance }) {
  const threshold = toleranceThreshold(device, tolerance);
  const metric = verdictMetric(device, tolerance);
  const lower = LOWER_IS_BETTER.includes(metric);

  const chart = useMemo(() => {
    const points = device.variants
      .filter((variant): variant is ReportVariant & { latency_ms: { p50: number }; accuracy: { value: number } } =>
        typeof variant.latency_ms?.p50 === 'number' && typeof variant.accuracy?.value === 'number',
      )
      .sort((a, b) => a.latency_ms.p50 - b.latency_ms.p50);
    if (points.length === 0) return null;
    const pick = (predicate: (variant: ReportVariant) => boolean) =>
      points.map((variant) => (predicate(variant) ? variant.accuracy.value : null));
    const isRecommended = (variant: ReportVariant) => variant.id === device.recommended;
    const data: uPlot.AlignedData = [
      points.map((variant) => variant.latency_ms.p50),
      pick((variant) => !isRecommended(variant) && variant.accuracy?.within_tolerance !== false),
      pick((variant) => !isRecommended(variant) && variant.accuracy?.within_tolerance === false),
      pick(isRecommended),
    ];
    const values = points.map((variant) => variant.accuracy.value).concat(threshold === null ? [] : [threshold]);
    const low = Math.min(...values);
    const high = Math.max(...values);
    const pad = (high - low || Math.abs(high) || 1) * 0.15;
    const none = () => null;
    const yValue = (_u: uPlot, value: number | null) => (value === null || value === undefined ? '' : formatNumber(value, 4));
    const options: Omit<uPlot.Options, 'width'> = {
      height: 300,
      // A live legend shows each series' value under the cursor, which is empty everywhere but on a point.
      legend: { live: false },
      cursor: { drag: { x: false, y: false }, points: { size: 12 } },
      scales: {
        x: { time: false, range: (_u, min, max) => [Math.max(0, min - (max - min || max) * 0.2), max + (max - min || max) * 0.2] },
        y: { range: () => [low - pad, high + pad] },
      },
      axes: [
        { label: 'Latency p50 (ms)', stroke: COLORS.axis, grid: { stroke: COLORS.grid } },
        { label: metric, stroke: COLORS.axis, grid: { stroke: COLORS.grid }, size: 64 },
      ],
      series: [
        { label: 'Variant', value: (_u, value, _s, index) => (index === null || index === undefined ? '—' : `${variantLabel(points[index])} · ${formatNumber(value, 3)} ms`) },
        { label: 'Within tolerance', stroke: COLORS.good, fill: COLORS.good, paths: none, value: yValue, points: scatterPoint(10, COLORS.good) },
        { label: 'Outside tolerance', stroke: COLORS.outside, fill: COLORS.outside, paths: none, value: yValue, points: scatterPoint(10, COLORS.outside) },
        { label: 'Recommended', stroke: COLORS.recommended, fill: COLORS.recommended, paths: none, value: yValue, points: scatterPoint(16, COLORS.recommended) },
      ],
      hooks: {
        draw: [
          (u) => {
            if (threshold === null) return;
            // The tolerance is a horizontal line across the whole plot, not a data series.
            const { ctx, bbox } = u;
            const y = Math.round(u.valToPos(threshold, 'y', true));
            ctx.save();
            ctx.strokeStyle = COLORS.bad;
            ctx.lineWidth = 1.5 * devicePixelRatio;
            ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
            ctx.beginPath();
            ctx.moveTo(bbox.left, y);
            ctx.lineTo(bbox.left + bbox.width, y);
            ctx.stroke();
            ctx.fillStyle = COLORS.bad;
            ctx.font = `${12 * devicePixelRatio}px system-ui, sans-serif`;
            ctx.textAlign = 'right';
            ctx.fillText('tolerance', bbox.left + bbox.width - 4 * devicePixelRatio, y - 4 * devicePixelRatio);
            ctx.restore();
          },
        ],
      },
    };
    const recommended = points.find(isRecommended);
    const label =
      `Scatter of ${points.length} variants, latency p50 against ${metric}.` +
      (threshold !== null ? ` Tolerance line at ${formatNumber(threshold, 4)}.` : '') +
      (recommended
        ? ` Recommended: ${variantLabel(recommended)} at ${formatNumber(recommended.latency_ms.p50, 3)} ms, ${formatNumber(recommended.accuracy.value, 4)}.`
        : '');
    return { data, options, label };
  }, [device, threshold, metric]);

  if (!chart) return <p className="muted">No variant has both a latency and an accuracy yet.</p>;
  return (
    <figure className="chart">
      <figcaption>
        Faster is further left, more accurate is {lower ? 'lower' : 'higher'} ({metric}). Variants must stay {lower ? 'below' : 'above'} the
        dashed tolerance line ({tolerance.metric === 'sqnr' ? `${tolerance.min_value ?? 30} dB` : `FP32 ${lower ? '+' : '−'} ${tolerance.max_drop ?? 0}`}).
      </figcaption>
      <UPlot options={chart.options} data={chart.data} label={chart.label} testId="latency-accuracy-chart" />
    </figure>
  );
}

export function OpTypeBreakdown({ device }: { device: ReportDevice }) {
  const profiled = device.variants.filter((variant) => (variant.profile?.by_op_type?.length ?? 0) > 0);
  const [selected, setSelected] = useState<number | null>(null);
  const selectId = useId();
  if (profiled.length === 0) return <p className="muted">No per-layer profile was recorded on this device.</p>;
  const variant =
    profiled.find((candidate) => candidate.id === selected) ??
    profiled.find((candidate) => candidate.id === device.recommended) ??
    profiled[0];
  const rows = [...(variant.profile?.by_op_type ?? [])].sort((a, b) => b.time_ms - a.time_ms).slice(0, 15);

  return (
    <figure className="chart">
      <div className="field field-inline">
        <label htmlFor={selectId}>Variant</label>
        <select id={selectId} value={variant.id} onChange={(event) => setSelected(Number(event.target.value))} data-testid="profile-variant-select">
          {profiled.map((candidate) => (
            <option key={candidate.id} value={candidate.id}>
              {variantLabel(candidate)}
              {candidate.id === device.recommended ? ' (recommended)' : ''}
            </option>
          ))}
        </select>
      </div>
      <figcaption>Time per operator type for {variantLabel(variant)}, slowest first.</figcaption>
      <BarList
        testId="op-type-chart"
        ariaLabel={`Time by operator type for ${variantLabel(variant)}`}
        data={rows.map((row) => ({
          label: row.op_type,
          value: row.time_ms,
          display: `${formatNumber(row.time_ms, 3)} ms`,
          title: `${row.count} node${row.count === 1 ? '' : 's'}, ${Math.round((row.share ?? 0) * 100)}% of the time`,
        }))}
      />
    </figure>
  );
}

export default function ReportCharts({ device, tolerance }: { device: ReportDevice; tolerance: Tolerance }) {
  return (
    <div className="grid-2">
      <section className="card" aria-label={`Latency and accuracy on ${device.agent?.name ?? 'device'}`}>
        <h3>Latency vs accuracy</h3>
        <LatencyAccuracyScatter device={device} tolerance={tolerance} />
      </section>
      <section className="card" aria-label={`Time by operator type on ${device.agent?.name ?? 'device'}`}>
        <h3>Time by operator type</h3>
        <OpTypeBreakdown device={device} />
      </section>
    </div>
  );
}
