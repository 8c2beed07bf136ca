/**
 * The report's charts, loaded on demand: latency against accuracy with the tolerance line
 * (uPlot, ~23 kB gzipped, instead of recharts at ~127 kB), and time per operator type.
 */
import { useEffect, useId, useMemo, useRef, useState } from 'react';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import type { ReportDevice, ReportVariant, SensitivityRow, Tolerance } from '../../api/types';
import { BarList } from '../../components/BarList';
import { formatNumber, formatRange } from '../../format';
import { layerRows, opTypeBars, profileCaption } from './profile';
import { variantLabel } from './ReportTable';
import {
  accuracyScale,
  cropTo,
  LABEL_HEIGHT,
  mergeCoincident,
  paddedRange,
  paretoFront,
  placeLabels,
  tickLabels,
  type PlacedLabel,
  zoomAround,
  zoomWindow,
  type Range,
} from './scatterGeometry';

const COLORS = {
  good: '#2f6f4f', bad: '#b04a3a', outside: '#9a8f85', recommended: '#b4532a', grid: '#ebe6df', axis: '#6b6259',
  band: 'rgba(47, 111, 79, 0.09)', pareto: '#2d5f8a',
};

/** Figures where a smaller value is better (an error, not an agreement). */
export const LOWER_IS_BETTER = ['relative_l2', 'cer'];
/** Figures that live between 0 and 1: their axis never shows a tick outside that. */
const UNBOUNDED = ['sqnr', 'sqnr_db'];

function verdictMetric(device: ReportDevice, tolerance: Tolerance): string {
  return device.variants.find((variant) => variant.accuracy?.metric)?.accuracy?.metric ?? tolerance.metric ?? 'auto';
}

/** FP32's own value of the metric, which the tolerance is read against. */
function referenceValue(device: ReportDevice): number | null {
  const withReference = device.variants.find(
    (variant) => typeof variant.accuracy?.reference_value === 'number' && Number.isFinite(variant.accuracy.reference_value),
  );
  const fp32 = device.variants.find((variant) => variant.precision === 'fp32' && typeof variant.accuracy?.value === 'number');
  const reference = withReference?.accuracy?.reference_value ?? fp32?.accuracy?.value ?? null;
  return reference === null || reference === undefined || !Number.isFinite(reference) ? null : reference;
}

/** The accuracy value a variant must reach: the FP32 reference minus the allowed drop (plus, for error figures). */
export function toleranceThreshold(device: ReportDevice, tolerance: Tolerance): number | null {
  if (tolerance.metric === 'sqnr') return tolerance.min_value ?? null;
  const lower = LOWER_IS_BETTER.includes(verdictMetric(device, tolerance));
  const reference = referenceValue(device);
  if (reference === null) return null;
  return lower ? reference + (tolerance.max_drop ?? 0) : reference - (tolerance.max_drop ?? 0);
}

type Plotted = ReportVariant & { latency_ms: { p50: number }; accuracy: { value: number } };

function isPlotted(variant: ReportVariant): variant is Plotted {
  return Number.isFinite(variant.latency_ms?.p50) && Number.isFinite(variant.accuracy?.value);
}

interface View {
  x: Range;
  y: Range;
}

const LABEL_FONT = '12px system-ui, sans-serif';
/** Pixels above the plot's far edge at which a variant off the scale is marked. */
const OFF_SCALE_INSET = 7;

/** The recommended point first (its label gets the best spot), then the Pareto front, then fastest first. */
function labelOrder(points: Plotted[], recommended: number | null | undefined, front: Set<number>): Plotted[] {
  return [...points].sort(
    (a, b) =>
      Number(b.id === recommended) - Number(a.id === recommended) || Number(front.has(b.id)) - Number(front.has(a.id)) || a.latency_ms.p50 - b.latency_ms.p50,
  );
}

interface ScatterModel {
  points: Plotted[];
  data: uPlot.AlignedData;
  home: View;
  /** Variant ids drawn at the accuracy axis's far edge with a mark: too far past the tolerance for its scale. */
  offScale: Set<number>;
  /** Variant ids on the Pareto front (the server's set when the report has one), fastest first. */
  front: number[];
  lowerIsBetter: boolean;
  bounded: boolean;
  reference: number | null;
  legend: { key: string; label: string }[];
  label: string;
  /** The one backend every point runs on, or null when they differ. */
  sharedBackend: string | null;
}

/** The name on the chart: without " on <backend>" when every point runs on that one backend (the caption says which). */
export function pointText(variant: Plotted, offScale: boolean, sharedBackend: string | null): string {
  const full = variantLabel(variant);
  const suffix = sharedBackend ? ` on ${sharedBackend}` : '';
  const name = suffix && full.endsWith(suffix) ? full.slice(0, -suffix.length) : full;
  return offScale ? `${name} (${formatNumber(variant.accuracy.value, 3)}, off the scale)` : name;
}

function sharedBackendOf(points: Plotted[]): string | null {
  const backends = new Set(points.map((variant) => variant.backend));
  return backends.size === 1 && points[0].backend ? points[0].backend : null;
}

/** Everything the scatter draws, from the report alone (no DOM): tested on a real agent's report. */
export function scatterModel(device: ReportDevice, threshold: number | null, metric: string): ScatterModel | null {
  const points = device.variants.filter(isPlotted).sort((a, b) => a.latency_ms.p50 - b.latency_ms.p50);
  if (points.length === 0) return null;
  const lowerIsBetter = LOWER_IS_BETTER.includes(metric);
  const bounded = !UNBOUNDED.includes(metric);
  const reference = referenceValue(device);
  const scale = accuracyScale(points.map((variant) => variant.accuracy.value), threshold, reference, lowerIsBetter);
  const offScale = new Set(scale.outliers.map((index) => points[index].id));
  const isRecommended = (variant: ReportVariant) => variant.id === device.recommended;
  const within = (variant: ReportVariant) => !isRecommended(variant) && variant.accuracy?.within_tolerance !== false;
  const outside = (variant: ReportVariant) => !isRecommended(variant) && variant.accuracy?.within_tolerance === false;
  // Off-scale points are drawn by hand at the edge, with their mark, not by uPlot at their (unseen) value.
  const pick = (predicate: (variant: ReportVariant) => boolean) =>
    points.map((variant) => (predicate(variant) && !offScale.has(variant.id) ? variant.accuracy.value : null));
  const data: uPlot.AlignedData = [points.map((variant) => variant.latency_ms.p50), pick(within), pick(outside), pick(isRecommended)];
  const latencies = points.map((variant) => variant.latency_ms.p50);
  const home = { x: paddedRange(Math.min(...latencies), Math.max(...latencies), 0.2, 0), y: scale.range };
  // The server marks the Pareto set; an older report without the flags gets it computed here.
  const flagged = points.some((variant) => typeof variant.pareto === 'boolean');
  const front = flagged
    ? points.filter((variant) => variant.pareto).map((variant) => variant.id)
    : paretoFront(points.map((variant) => ({ x: variant.latency_ms.p50, y: variant.accuracy.value, id: variant.id })), lowerIsBetter).map((entry) => entry.id);
  // Only what is on this chart: a legend entry with nothing behind it is noise.
  const legend = [
    { key: 'within', label: 'Within tolerance', shown: points.some(within) },
    { key: 'outside', label: 'Outside tolerance', shown: points.some(outside) },
    { key: 'recommended', label: 'Recommended', shown: points.some(isRecommended) },
    { key: 'tolerance', label: 'Tolerance', shown: threshold !== null },
    { key: 'pareto', label: 'Pareto front', shown: front.length > 1 },
    { key: 'offscale', label: 'Off the scale (value in its label)', shown: offScale.size > 0 },
  ].filter((entry) => entry.shown);
  const recommended = points.find(isRecommended);
  const label =
    `Scatter of ${points.length} variants, latency p50 against ${metric}: ` +
    points.map((variant) => `${variantLabel(variant)} ${formatNumber(variant.latency_ms.p50, 3)} ms, ${formatNumber(variant.accuracy.value, 4)}`).join('; ') +
    '.' +
    (threshold !== null ? ` Tolerance line at ${formatNumber(threshold, 4)}.` : '') +
    (offScale.size > 0 ? ` ${offScale.size} drawn at the edge, off the scale.` : '') +
    (recommended ? ` Recommended: ${variantLabel(recommended)}.` : '');
  return { points, data, home, offScale, front, lowerIsBetter, bounded, reference, legend, label, sharedBackend: sharedBackendOf(points) };
}

/** Where a point is drawn, in CSS pixels inside the plot: off-scale ones sit at the far edge of the accuracy axis. */
function pointPosition(u: uPlot, variant: Plotted, model: ScatterModel, height: number): { x: number; y: number } {
  const x = u.valToPos(variant.latency_ms.p50, 'x');
  if (!model.offScale.has(variant.id)) return { x, y: u.valToPos(variant.accuracy.value, 'y') };
  return { x, y: model.lowerIsBetter ? OFF_SCALE_INSET : height - OFF_SCALE_INSET };
}

/** Puts the variant names next to their points, as HTML over the canvas so that they can be read, selected and found;
 * a name with no free spot appears when its point is hovered or focused (every point is a focusable button). */
function drawLabels(u: uPlot, layer: HTMLDivElement, model: ScatterModel, recommended: number | null | undefined): void {
  const width = u.over.clientWidth || u.bbox.width / devicePixelRatio;
  const height = u.over.clientHeight || u.bbox.height / devicePixelRatio;
  u.ctx.save();
  u.ctx.font = LABEL_FONT;
  const measure = (text: string) => Math.ceil(u.ctx.measureText(text).width) + 8;
  const inside = (position: { x: number; y: number }) => position.x >= 0 && position.x <= width && position.y >= 0 && position.y <= height;
  const visible = labelOrder(model.points, recommended, new Set(model.front))
    .map((variant) => ({ variant, position: pointPosition(u, variant, model, height) }))
    .filter((entry) => inside(entry.position));
  const anchors = visible.map(({ variant, position }) => {
    const text = pointText(variant, model.offScale.has(variant.id), model.sharedBackend);
    return { ...position, text, width: measure(text) };
  });
  const placed = placeLabels(mergeCoincident(anchors, 3, measure), width, height);
  // Leader lines for labels pushed away from their point.
  u.ctx.strokeStyle = COLORS.axis;
  u.ctx.lineWidth = devicePixelRatio;
  for (const label of placed.filter((candidate) => candidate.leader)) {
    const toX = label.left < label.x ? label.left + label.width : label.left;
    const toY = label.top + LABEL_HEIGHT / 2;
    u.ctx.beginPath();
    u.ctx.moveTo(u.bbox.left + label.x * devicePixelRatio, u.bbox.top + label.y * devicePixelRatio);
    u.ctx.lineTo(u.bbox.left + toX * devicePixelRatio, u.bbox.top + toY * devicePixelRatio);
    u.ctx.stroke();
  }
  u.ctx.restore();
  const labelFor = (x: number, y: number) => placed.find((label) => Math.abs(label.x - x) <= 3 && Math.abs(label.y - y) <= 3);
  const emitted = new Set<PlacedLabel>();
  layer.replaceChildren(
    ...visible.flatMap(({ variant, position }) => {
      const hit = document.createElement('button');
      hit.type = 'button';
      hit.className = 'chart-point-hit';
      hit.dataset.testid = 'point-hit';
      hit.style.left = `${position.x}px`;
      hit.style.top = `${position.y}px`;
      hit.setAttribute(
        'aria-label',
        `${variantLabel(variant)}: ${formatNumber(variant.latency_ms.p50, 3)} ms, ${formatNumber(variant.accuracy.value, 4)}` +
          (model.offScale.has(variant.id) ? ' (off the scale)' : ''),
      );
      const label = labelFor(position.x, position.y);
      // A merged label belongs to the first point of its group; the others only get their button.
      if (!label || label.x !== position.x || label.y !== position.y || emitted.has(label)) return [hit];
      emitted.add(label);
      const element = document.createElement('span');
      element.className = label.hidden ? 'chart-point-label chart-point-label-hover' : 'chart-point-label';
      element.dataset.testid = label.hidden ? 'point-label-hover' : 'point-label';
      element.textContent = label.text;
      // A name wider than a phone's plot wraps inside it instead of widening the page.
      const fitted = Math.min(label.width, width);
      element.style.left = `${Math.max(0, Math.min(label.left, width - fitted))}px`;
      element.style.top = `${label.top}px`;
      element.style.width = `${fitted}px`;
      return [hit, element];
    }),
  );
}

/** The band a variant must stay in, from FP32's value to the tolerance: drawn first, under the grid and points. */
function drawToleranceBand(u: uPlot, threshold: number, reference: number | null): void {
  if (reference === null) return;
  const { ctx, bbox } = u;
  const clamp = (value: number) => Math.min(bbox.top + bbox.height, Math.max(bbox.top, value));
  const edge = clamp(Math.round(u.valToPos(reference, 'y', true)));
  const line = clamp(Math.round(u.valToPos(threshold, 'y', true)));
  ctx.save();
  ctx.fillStyle = COLORS.band;
  ctx.fillRect(bbox.left, Math.min(edge, line), bbox.width, Math.abs(line - edge));
  ctx.restore();
}

/** The tolerance as a dashed line across the whole plot (not a data series), over the grid. */
function drawToleranceLine(u: uPlot, threshold: number): void {
  const { ctx, bbox } = u;
  const y = Math.round(u.valToPos(threshold, 'y', true));
  if (y < bbox.top || y > bbox.top + bbox.height) return;
  ctx.save();
  ctx.strokeStyle = COLORS.bad;
  ctx.lineWidth = 1.5 * devicePixelRatio;
  ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
  ctx.beginPath();
  ctx.moveTo(bbox.left, y);
  ctx.lineTo(bbox.left + bbox.width, y);
  ctx.stroke();
  ctx.restore();
}

/** The Pareto front as a staircase through its points: what is worth paying in latency for accuracy. */
function drawParetoFront(u: uPlot, model: ScatterModel, height: number): void {
  const byId = new Map(model.points.map((variant) => [variant.id, variant]));
  const positions = model.front.flatMap((id) => {
    const variant = byId.get(id);
    return variant ? [pointPosition(u, variant, model, height)] : [];
  });
  if (positions.length < 2) return;
  const { ctx, bbox } = u;
  const px = (value: number) => value * devicePixelRatio;
  ctx.save();
  ctx.beginPath();
  ctx.rect(bbox.left, bbox.top, bbox.width, bbox.height);
  ctx.clip();
  ctx.strokeStyle = COLORS.pareto;
  ctx.lineWidth = 1.5 * devicePixelRatio;
  ctx.setLineDash([2 * devicePixelRatio, 3 * devicePixelRatio]);
  ctx.beginPath();
  ctx.moveTo(bbox.left + px(positions[0].x), bbox.top + px(positions[0].y));
  for (const [index, position] of positions.slice(1).entries()) {
    ctx.lineTo(bbox.left + px(position.x), bbox.top + px(positions[index].y));
    ctx.lineTo(bbox.left + px(position.x), bbox.top + px(position.y));
  }
  ctx.stroke();
  ctx.restore();
}

/** A triangle at the far edge pointing off the scale, in the colour the point would have. */
function drawOffScale(u: uPlot, model: ScatterModel, recommended: number | null | undefined, height: number): void {
  const { ctx, bbox } = u;
  const px = (value: number) => value * devicePixelRatio;
  ctx.save();
  for (const variant of model.points.filter((candidate) => model.offScale.has(candidate.id))) {
    const { x, y } = pointPosition(u, variant, model, height);
    if (x < 0 || x > bbox.width / devicePixelRatio) continue;
    const colour = variant.id === recommended ? COLORS.recommended : variant.accuracy.within_tolerance === false ? COLORS.outside : COLORS.good;
    const tip = model.lowerIsBetter ? -6 : 6;
    ctx.fillStyle = colour;
    ctx.beginPath();
    ctx.moveTo(bbox.left + px(x - 6), bbox.top + px(y - tip));
    ctx.lineTo(bbox.left + px(x + 6), bbox.top + px(y - tip));
    ctx.lineTo(bbox.left + px(x), bbox.top + px(y + tip));
    ctx.closePath();
    ctx.fill();
  }
  ctx.restore();
}

function scatterPoint(size: number, fill: string): uPlot.Series.Points {
  return { show: true, size, fill, stroke: fill, width: 1 };
}

/** The point a keyboard zoom centres on: the recommended variant when in view, else the middle of the points in view. */
function zoomFocus(model: ScatterModel, view: View, recommended: number | null | undefined): { x: number | null; y: number | null } {
  const inView = model.points.filter(
    (variant) => !model.offScale.has(variant.id) && variant.latency_ms.p50 >= view.x[0] && variant.latency_ms.p50 <= view.x[1] &&
      variant.accuracy.value >= view.y[0] && variant.accuracy.value <= view.y[1],
  );
  const chosen = inView.find((variant) => variant.id === recommended);
  if (chosen) return { x: chosen.latency_ms.p50, y: chosen.accuracy.value };
  if (inView.length === 0) return { x: null, y: null };
  const middle = inView[Math.floor((inView.length - 1) / 2)];
  return { x: middle.latency_ms.p50, y: middle.accuracy.value };
}

function ScatterPlot({ model, threshold, metric, recommended }: { model: ScatterModel; threshold: number | null; metric: string; recommended: number | null | undefined }) {
  const host = useRef<HTMLDivElement>(null);
  const plotRef = useRef<uPlot | null>(null);
  const zoom = useRef<View | null>(null);
  const [view, setView] = useState<View>(model.home);

  useEffect(() => {
    const element = host.current;
    if (!element) return undefined;
    zoom.current = null;
    const labels = document.createElement('div');
    labels.className = 'chart-point-labels';
    const sameView = (a: View, b: View) => a.x[0] === b.x[0] && a.x[1] === b.x[1] && a.y[0] === b.y[0] && a.y[1] === b.y[1];
    // A share never reads above 1 or below 0, even where the axis is padded past them.
    const ySplits = (_u: uPlot, _axis: number, min: number, max: number, increment: number) => {
      const splits: number[] = [];
      for (let value = Math.ceil(min / increment) * increment; value <= max + increment * 1e-9; value += increment) splits.push(Number(value.toPrecision(12)));
      return model.bounded ? splits.filter((value) => value >= 0 && value <= 1) : splits;
    };
    const options: uPlot.Options = {
      width: element.clientWidth || 560,
      height: 300,
      // The legend is ours (fixed, above the plot): uPlot's shows empty values until hover.
      legend: { show: false },
      cursor: {
        // Drag a box to zoom; the selection is applied by the setSelect hook (never a zero-width box).
        drag: { x: true, y: true, setScale: false },
        points: { show: false },
        bind: { dblclick: () => null },
      },
      scales: {
        x: { time: false, range: () => zoom.current?.x ?? model.home.x },
        y: { range: () => zoom.current?.y ?? model.home.y },
      },
      axes: [
        { label: 'Latency p50 (ms)', stroke: COLORS.axis, grid: { stroke: COLORS.grid }, values: (_u, splits) => tickLabels(splits) },
        { label: metric, stroke: COLORS.axis, grid: { stroke: COLORS.grid }, size: 64, splits: ySplits, values: (_u, splits) => tickLabels(splits) },
      ],
      series: [
        {},
        { label: 'Within tolerance', stroke: COLORS.good, paths: () => null, points: scatterPoint(10, COLORS.good) },
        { label: 'Outside tolerance', stroke: COLORS.outside, paths: () => null, points: scatterPoint(10, COLORS.outside) },
        { label: 'Recommended', stroke: COLORS.recommended, paths: () => null, points: scatterPoint(16, COLORS.recommended) },
      ],
      hooks: {
        drawClear: [(u) => (threshold !== null ? drawToleranceBand(u, threshold, model.reference) : undefined)],
        draw: [
          (u) => {
            const height = u.over.clientHeight || u.bbox.height / devicePixelRatio;
            if (threshold !== null) drawToleranceLine(u, threshold);
            drawParetoFront(u, model, height);
            drawOffScale(u, model, recommended, height);
            drawLabels(u, labels, model, recommended);
            const now = { x: [u.scales.x.min ?? 0, u.scales.x.max ?? 1], y: [u.scales.y.min ?? 0, u.scales.y.max ?? 1] } as View;
            setView((previous) => (sameView(previous, now) ? previous : now));
          },
        ],
        setSelect: [
          (u) => {
            const { left, top, width, height } = u.select;
            if (width < 4 && height < 4) return;
            const current = { x: [u.scales.x.min ?? 0, u.scales.x.max ?? 1], y: [u.scales.y.min ?? 0, u.scales.y.max ?? 1] } as View;
            // A box dragged past the data is cut to it: zoom never shows more than the data's own range.
            const within = (range: Range | null, bounds: Range) => (range ? cropTo(range, bounds) : null);
            const x = width >= 4 ? within(zoomWindow(u.posToVal(left, 'x'), u.posToVal(left + width, 'x'), current.x), model.home.x) : null;
            const y = height >= 4 ? within(zoomWindow(u.posToVal(top + height, 'y'), u.posToVal(top, 'y'), current.y), model.home.y) : null;
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            if (x || y) applyView(u, { x: x ?? current.x, y: y ?? current.y });
          },
        ],
      },
    };
    const plot = new uPlot(options, model.data, element);
    plot.over.appendChild(labels);
    const reset = () => applyView(plot, null);
    plot.over.addEventListener('dblclick', reset);
    plotRef.current = plot;
    const observer = typeof ResizeObserver === 'undefined' ? null : new ResizeObserver(() => plot.setSize({ width: element.clientWidth || 560, height: 300 }));
    observer?.observe(element);
    return () => {
      observer?.disconnect();
      plot.over.removeEventListener('dblclick', reset);
      plot.destroy();
      plotRef.current = null;
    };

    function applyView(u: uPlot, next: View | null) {
      zoom.current = next;
      const x = next?.x ?? model.home.x;
      // Setting x re-ranges y through its range function, which reads zoom.current.
      u.setScale('x', { min: x[0], max: x[1] });
    }
  }, [model, threshold, metric, recommended]);

  const zoomBy = (factor: number | null) => {
    const plot = plotRef.current;
    if (!plot) return;
    if (factor === null) {
      zoom.current = null;
    } else {
      const focus = zoomFocus(model, view, recommended);
      const next = { x: zoomAround(view.x, factor, focus.x, model.home.x), y: zoomAround(view.y, factor, focus.y, model.home.y) };
      const home = next.x[0] === model.home.x[0] && next.x[1] === model.home.x[1] && next.y[0] === model.home.y[0] && next.y[1] === model.home.y[1];
      zoom.current = home ? null : next;
    }
    const x = zoom.current?.x ?? model.home.x;
    plot.setScale('x', { min: x[0], max: x[1] });
  };
  const zoomed = view.x[0] !== model.home.x[0] || view.x[1] !== model.home.x[1] || view.y[0] !== model.home.y[0] || view.y[1] !== model.home.y[1];

  return (
    <>
      <ul className="chart-legend" data-testid="chart-legend" aria-label="Legend">
        {model.legend.map((entry) => (
          <li key={entry.key}>
            <span className={`chart-swatch chart-swatch-${entry.key}`} aria-hidden="true" />
            {entry.label}
          </li>
        ))}
      </ul>
      <div
        ref={host}
        className="uplot-host"
        role="group"
        aria-label={model.label}
        data-testid="latency-accuracy-chart"
        data-x-min={view.x[0]}
        data-x-max={view.x[1]}
        data-y-min={view.y[0]}
        data-y-max={view.y[1]}
        data-home-y-min={model.home.y[0]}
        data-home-y-max={model.home.y[1]}
        data-off-scale={model.offScale.size}
      />
      <div className="button-row chart-zoom" role="group" aria-label="Zoom">
        <button type="button" className="button button-small" onClick={() => zoomBy(0.5)} data-testid="zoom-in">
          Zoom in
        </button>
        <button type="button" className="button button-small" onClick={() => zoomBy(2)} disabled={!zoomed} data-testid="zoom-out">
          Zoom out
        </button>
        <button type="button" className="button button-small" onClick={() => zoomBy(null)} disabled={!zoomed} data-testid="zoom-reset">
          Reset zoom
        </button>
        <span className="muted small" data-testid="zoom-range">
          {formatRange(view.x[0], view.x[1])}
        </span>
      </div>
    </>
  );
}

export function LatencyAccuracyScatter({ device, tolerance }: { device: ReportDevice; tolerance: Tolerance }) {
  const threshold = toleranceThreshold(device, tolerance);
  const metric = verdictMetric(device, tolerance);
  const lower = LOWER_IS_BETTER.includes(metric);
  const model = useMemo(() => scatterModel(device, threshold, metric), [device, threshold, metric]);

  if (!model) return <p className="muted">No variant has both a latency and an accuracy yet.</p>;
  const unplotted = device.variants.length - model.points.length;
  return (
    <figure className="chart">
      <figcaption data-testid="scatter-caption">
        Faster is further left, more accurate is {lower ? 'lower' : 'higher'} ({metric}). Variants must stay {lower ? 'below' : 'above'} the
        dashed tolerance line ({tolerance.metric === 'sqnr' ? `${tolerance.min_value ?? 30} dB` : `FP32 ${lower ? '+' : '−'} ${tolerance.max_drop ?? 0}`}), in the shaded band.
        {model.front.length > 1 ? ' The dotted staircase is the Pareto front: no variant is both faster and more accurate than one on it.' : ''}
        {model.offScale.size > 0
          ? ` ${model.offScale.size} variant${model.offScale.size === 1 ? ' is' : 's are'} so far past the tolerance that ${model.offScale.size === 1 ? 'it is' : 'they are'} drawn at the edge with a triangle, ${model.offScale.size === 1 ? 'its' : 'their'} value in the label.`
          : ''}{' '}
        {model.sharedBackend ? `All on ${model.sharedBackend}. ` : ''}Hover or focus a point for its name and numbers; drag a box to zoom in, double-click or Reset zoom to see everything.
        {unplotted > 0 ? ` ${unplotted} variant${unplotted === 1 ? ' has' : 's have'} no latency or accuracy and ${unplotted === 1 ? 'is' : 'are'} not plotted.` : ''}
      </figcaption>
      <ScatterPlot model={model} threshold={threshold} metric={metric} recommended={device.recommended} />
    </figure>
  );
}

const LAYER_LIMIT = 15;

/** Per layer: the slowest nodes of a variant beside how much INT8 hurts each (the search's sensitivity). */
export function LayerTable({ variant, sensitivity, sensitivityNote }: { variant: ReportVariant; sensitivity: SensitivityRow[]; sensitivityNote?: string }) {
  const rows = layerRows(variant, sensitivity, LAYER_LIMIT);
  if (rows.length === 0) return null;
  const matched = rows.filter((row) => row.sqnrDb !== null).length;
  return (
    <div className="table-wrap">
      <table className="table table-compact table-cards" data-testid="layer-table">
        <caption className="muted small">
          {rows.length === LAYER_LIMIT ? `The ${LAYER_LIMIT} slowest layers` : 'The layers'} of {variantLabel(variant)}, slowest first, with their part of the p50 (share of the profiled time) and
          {sensitivity.length > 0
            ? ` their quantization sensitivity: the SQNR of the layer's output under INT8, lower hurts more (${matched} of these layers were ranked by the search).`
            : ` no quantization sensitivity. ${sensitivityNote || 'The search ranks layers only for an auto deployment that tries INT8.'}`}
        </caption>
        <thead>
          <tr>
            <th scope="col">Layer</th>
            <th scope="col">Op</th>
            <th scope="col" className="numeric">Of the p50</th>
            <th scope="col" className="numeric">Share</th>
            <th scope="col" className="numeric col-p2">Profiled</th>
            <th scope="col" className="numeric">INT8 SQNR (dB)</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((row) => (
            <tr key={`${row.runtimeName ?? ''}|${row.name}`} data-testid="layer-row">
              <td data-label="">
                <code>{row.name}</code>
                {row.runtimeName ? <div className="muted small" title="The runtime's name for this node">runtime: <code>{row.runtimeName}</code></div> : null}
              </td>
              <td data-label="Op">{row.opType}</td>
              <td className="numeric" data-label="Of the p50">{row.ofP50Ms === null ? '—' : `${formatNumber(row.ofP50Ms, 4)} ms`}</td>
              <td className="numeric" data-label="Share">{Math.round(row.share * 100)}%</td>
              <td className="numeric col-p2" data-label="Profiled">{formatNumber(row.profiledMs, 4)} ms</td>
              <td className="numeric" data-label="INT8 SQNR (dB)">{row.sqnrDb === null ? '—' : formatNumber(row.sqnrDb, 1)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** The variants of a device with a per-operator profile, and the one to show first (the recommended). */
function profiledVariants(device: ReportDevice, selected: number | null): { profiled: ReportVariant[]; variant: ReportVariant | null } {
  const profiled = device.variants.filter((variant) => (variant.profile?.by_op_type?.length ?? 0) > 0);
  const variant =
    profiled.find((candidate) => candidate.id === selected) ?? profiled.find((candidate) => candidate.id === device.recommended) ?? profiled[0] ?? null;
  return { profiled, variant };
}

export function OpTypeBreakdown({ device, variant, profiled, onSelect }: { device: ReportDevice; variant: ReportVariant | null; profiled: ReportVariant[]; onSelect: (id: number) => void }) {
  const selectId = useId();
  if (!variant) return <p className="muted">No per-operator profile was recorded on this device (the runtime has no profiler, or profiling failed).</p>;
  const bars = opTypeBars(variant).slice(0, 15);

  return (
    <figure className="chart">
      <div className="field field-inline">
        <label htmlFor={selectId}>Variant</label>
        <select id={selectId} value={variant.id} onChange={(event) => onSelect(Number(event.target.value))} data-testid="profile-variant-select">
          {profiled.map((candidate) => (
            <option key={candidate.id} value={candidate.id}>
              {variantLabel(candidate)}
              {candidate.id === device.recommended ? ' (recommended)' : ''}
            </option>
          ))}
        </select>
      </div>
      <figcaption data-testid="op-type-caption">{profileCaption(variant, variantLabel(variant))}</figcaption>
      <BarList
        testId="op-type-chart"
        ariaLabel={`Time by operator type for ${variantLabel(variant)}`}
        data={bars.map((bar) => ({
          label: bar.opType,
          value: bar.ofP50Ms ?? bar.profiledMs,
          display: bar.ofP50Ms === null ? `${formatNumber(bar.profiledMs, 3)} ms` : `${formatNumber(bar.ofP50Ms, 4)} ms`,
          title: `${bar.count} node${bar.count === 1 ? '' : 's'}, ${Math.round(bar.share * 100)}% of the profiled time; profiled ${formatNumber(bar.profiledMs, 4)} ms per run`,
        }))}
      />
    </figure>
  );
}

export default function ReportCharts({ device, tolerance, sensitivity = [], sensitivityNote }: { device: ReportDevice; tolerance: Tolerance; sensitivity?: SensitivityRow[]; sensitivityNote?: string }) {
  const [selected, setSelected] = useState<number | null>(null);
  const { profiled, variant } = profiledVariants(device, selected);
  const name = device.agent?.name ?? 'device';
  return (
    <>
      <div className="grid-2">
        <section className="card" aria-label={`Latency and accuracy on ${name}`}>
          <h3>Latency vs accuracy</h3>
          <LatencyAccuracyScatter device={device} tolerance={tolerance} />
        </section>
        <section className="card" aria-label={`Time by operator type on ${name}`}>
          <h3>Time by operator type</h3>
          <OpTypeBreakdown device={device} variant={variant} profiled={profiled} onSelect={setSelected} />
        </section>
      </div>
      {variant && layerRows(variant, sensitivity).length > 0 ? (
        <section className="card" aria-label={`Per layer on ${name}`} data-testid="layer-view">
          <h3>Per layer: time and quantization sensitivity</h3>
          <LayerTable variant={variant} sensitivity={sensitivity} sensitivityNote={sensitivityNote} />
        </section>
      ) : null}
    </>
  );
}
