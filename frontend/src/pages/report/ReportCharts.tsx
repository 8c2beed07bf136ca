/**
 * The report's charts (loaded on demand so recharts stays out of the main bundle): latency
 * against accuracy with the tolerance line, and time per operator type for one variant.
 */
import { useId, useState } from 'react';
import {
  Bar,
  BarChart,
  CartesianGrid,
  Legend,
  ReferenceLine,
  ResponsiveContainer,
  Scatter,
  ScatterChart,
  Tooltip,
  XAxis,
  YAxis,
  ZAxis,
} from 'recharts';
import type { ReportDevice, Tolerance } from '../../api/types';
import { variantLabel } from './ReportTable';

const COLORS = { good: '#2f6f4f', bad: '#b04a3a', recommended: '#b4532a', grid: '#e4ded6', axis: '#6b6259' };

/** The accuracy value a variant must reach: the FP32 reference minus the allowed drop. */
export function toleranceThreshold(device: ReportDevice, tolerance: Tolerance): number | null {
  const withReference = device.variants.find(
    (variant) => typeof variant.accuracy?.reference_value === 'number' && Number.isFinite(variant.accuracy.reference_value),
  );
  const fp32 = device.variants.find((variant) => variant.precision === 'fp32' && typeof variant.accuracy?.value === 'number');
  const reference = withReference?.accuracy?.reference_value ?? fp32?.accuracy?.value ?? null;
  if (reference === null || reference === undefined || !Number.isFinite(reference)) return null;
  return reference - tolerance.max_drop;
}

interface Point {
  x: number;
  y: number;
  name: string;
}

export function LatencyAccuracyScatter({ device, tolerance }: { device: ReportDevice; tolerance: Tolerance }) {
  const groups: Record<'recommended' | 'within' | 'outside', Point[]> = { recommended: [], within: [], outside: [] };
  for (const variant of device.variants) {
    const x = variant.latency_ms?.p50;
    const y = variant.accuracy?.value;
    if (typeof x !== 'number' || typeof y !== 'number') continue;
    const point = { x, y, name: variantLabel(variant) };
    if (variant.id === device.recommended) groups.recommended.push(point);
    else if (variant.accuracy?.within_tolerance === false) groups.outside.push(point);
    else groups.within.push(point);
  }
  const threshold = toleranceThreshold(device, tolerance);
  const metric = device.variants.find((variant) => variant.accuracy?.metric)?.accuracy?.metric ?? tolerance.metric;
  const count = groups.recommended.length + groups.within.length + groups.outside.length;
  if (count === 0) return <p className="muted">No variant has both a latency and an accuracy yet.</p>;

  return (
    <figure className="chart" data-testid="latency-accuracy-chart">
      <figcaption>
        Latency p50 against {metric}; the dashed line is the tolerance (FP32 − {tolerance.max_drop}). Lower-left is faster,
        higher is more accurate.
      </figcaption>
      <ResponsiveContainer width="100%" height={300}>
        <ScatterChart margin={{ top: 16, right: 24, bottom: 24, left: 8 }}>
          <CartesianGrid stroke={COLORS.grid} />
          <XAxis type="number" dataKey="x" name="Latency p50" unit=" ms" stroke={COLORS.axis} label={{ value: 'Latency p50 (ms)', position: 'bottom', offset: 4 }} />
          <YAxis type="number" dataKey="y" name={metric} domain={['auto', 'auto']} stroke={COLORS.axis} width={72} />
          <ZAxis range={[80, 80]} />
          <Tooltip
            cursor={{ strokeDasharray: '3 3' }}
            formatter={(value) => (typeof value === 'number' ? value.toPrecision(4) : String(value))}
            labelFormatter={() => ''}
          />
          <Legend verticalAlign="top" height={28} />
          {threshold !== null ? (
            <ReferenceLine y={threshold} stroke={COLORS.bad} strokeDasharray="6 4" label={{ value: 'tolerance', position: 'insideTopRight', fill: COLORS.bad }} />
          ) : null}
          <Scatter name="Within tolerance" data={groups.within} fill={COLORS.good} />
          <Scatter name="Outside tolerance" data={groups.outside} fill={COLORS.bad} shape="cross" />
          <Scatter name="Recommended" data={groups.recommended} fill={COLORS.recommended} shape="star" />
        </ScatterChart>
      </ResponsiveContainer>
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
  const data = [...(variant.profile?.by_op_type ?? [])]
    .sort((a, b) => b.time_ms - a.time_ms)
    .slice(0, 15)
    .map((row) => ({ op: row.op_type, time: row.time_ms, count: row.count }));

  return (
    <figure className="chart" data-testid="op-type-chart">
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
      <figcaption>Time per operator type for {variantLabel(variant)} (top {data.length}).</figcaption>
      <ResponsiveContainer width="100%" height={Math.max(160, data.length * 26 + 40)}>
        <BarChart data={data} layout="vertical" margin={{ top: 8, right: 24, bottom: 8, left: 8 }}>
          <CartesianGrid stroke={COLORS.grid} horizontal={false} />
          <XAxis type="number" unit=" ms" stroke={COLORS.axis} />
          <YAxis type="category" dataKey="op" width={120} stroke={COLORS.axis} />
          <Tooltip formatter={(value) => `${typeof value === 'number' ? value.toPrecision(3) : value} ms`} />
          <Bar dataKey="time" name="Time" fill={COLORS.recommended} radius={[0, 3, 3, 0]} />
        </BarChart>
      </ResponsiveContainer>
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
