/**
 * Pure geometry for the latency-vs-accuracy scatter: axis ranges that never collapse, and point
 * labels placed so that they overlap neither each other nor the points.
 */

export type Range = [number, number];

/**
 * A range around `low`..`high` with `fraction` of its width added on each side.
 *
 * A real agent's report often has every point at one accuracy (every FP32 build agrees 100% with
 * the reference), so `low === high`; uPlot's tick generation never ends on a zero-width range, which
 * froze the page on "Loading charts…". A flat or non-finite range is therefore widened.
 */
export function paddedRange(low: number, high: number, fraction = 0.15, floor: number | null = null): Range {
  if (!Number.isFinite(low) || !Number.isFinite(high)) return [0, 1];
  const width = high - low;
  const pad = width > 0 ? width * fraction : Math.abs(high) * fraction || 1;
  const start = low - pad;
  return [floor === null ? start : Math.max(floor, start), high + pad];
}

/** A zoom window from two values in either order, or null when it is too thin to mean anything. */
export function zoomWindow(a: number, b: number, current: Range): Range | null {
  const low = Math.min(a, b);
  const high = Math.max(a, b);
  if (!Number.isFinite(low) || !Number.isFinite(high)) return null;
  // Under 1/1000 of the current view is a click that drifted, not a selection.
  if (high - low <= (current[1] - current[0]) * 1e-3) return null;
  return [low, high];
}

/** The middle `factor` of a range (factor < 1 zooms in, > 1 out). */
export function scaleRange([low, high]: Range, factor: number): Range {
  const middle = (low + high) / 2;
  const half = ((high - low) / 2) * factor;
  return [middle - half, middle + half];
}

/**
 * A window moved (never stretched) to lie inside `bounds`; one wider than the bounds becomes the bounds.
 * Zooming never shows more than the data's own range, so it never goes above an accuracy of 1.0.
 */
export function keepInside([low, high]: Range, bounds: Range): Range {
  const width = high - low;
  if (!(width > 0) || width >= bounds[1] - bounds[0]) return [bounds[0], bounds[1]];
  if (low < bounds[0]) return [bounds[0], bounds[0] + width];
  if (high > bounds[1]) return [bounds[1] - width, bounds[1]];
  return [low, high];
}

/** A selection cut to the bounds, or null when nothing of it is left. */
export function cropTo([low, high]: Range, bounds: Range): Range | null {
  const cropped: Range = [Math.max(low, bounds[0]), Math.min(high, bounds[1])];
  return cropped[1] > cropped[0] ? cropped : null;
}

/**
 * `factor` of the current window around `focus` (a point worth looking at: the recommended variant, or the
 * middle of the points in view), kept inside the bounds: the keyboard's Zoom in lands on data, not on an empty middle.
 */
export function zoomAround(view: Range, factor: number, focus: number | null, bounds: Range): Range {
  const half = ((view[1] - view[0]) / 2) * factor;
  const centre = focus !== null && Number.isFinite(focus) && focus >= view[0] && focus <= view[1] ? focus : (view[0] + view[1]) / 2;
  return keepInside([centre - half, centre + half], bounds);
}

export interface AccuracyScale {
  /** The y range at home: the variants within reach of the tolerance, the FP32 reference and the tolerance line. */
  range: Range;
  /** Indexes of the values drawn at the range's edge with a mark: too far beyond the tolerance to share the scale. */
  outliers: number[];
}

/** How far past the tolerance line a variant still shares the scale, in widths of the tolerance band. */
export const REACH_BANDS = 3;

/**
 * The accuracy axis fitted to the variants that matter: those within reach of the tolerance. One collapsed INT8
 * variant at 0.3 would otherwise stretch the axis to 0–1 and put every useful point on one line.
 */
export function accuracyScale(values: number[], threshold: number | null, reference: number | null, lowerIsBetter: boolean): AccuracyScale {
  const finite = values.filter(Number.isFinite);
  if (threshold === null || !Number.isFinite(threshold) || finite.length === 0) {
    const extra = threshold !== null && Number.isFinite(threshold) ? [threshold] : [];
    return { range: paddedRange(Math.min(...finite, ...extra), Math.max(...finite, ...extra)), outliers: [] };
  }
  const top = reference !== null && Number.isFinite(reference) ? reference : lowerIsBetter ? Math.min(...finite) : Math.max(...finite);
  // A zero tolerance still has a band worth drawing: a hundredth of the reference, or 0.01.
  const band = Math.abs(top - threshold) || Math.abs(top) * 0.01 || 0.01;
  const limit = lowerIsBetter ? threshold + REACH_BANDS * band : threshold - REACH_BANDS * band;
  const inReach = (value: number) => (lowerIsBetter ? value <= limit : value >= limit);
  const outliers = values.flatMap((value, index) => (Number.isFinite(value) && !inReach(value) ? [index] : []));
  const kept = finite.filter(inReach).concat([threshold, top]);
  const [low, high] = paddedRange(Math.min(...kept), Math.max(...kept), 0.12);
  // Room at the far edge for the outliers' marks.
  const room = outliers.length ? (high - low) * 0.08 : 0;
  return { range: lowerIsBetter ? [low, high + room] : [low - room, high], outliers };
}

export interface ScatterPointXY {
  x: number;
  y: number;
}

/**
 * The Pareto front: the points no other point beats on both latency (lower) and accuracy (higher, or lower
 * for an error figure), fastest first. Ties on both are kept.
 */
export function paretoFront<T extends ScatterPointXY>(points: T[], lowerIsBetter = false): T[] {
  const better = (a: number, b: number) => (lowerIsBetter ? a < b : a > b);
  const dominated = (p: T) => points.some((q) => q !== p && q.x <= p.x && !better(p.y, q.y) && (q.x < p.x || better(q.y, p.y)));
  return points.filter((p) => !dominated(p)).sort((a, b) => a.x - b.x || (better(a.y, b.y) ? -1 : 1));
}

export interface LabelAnchor {
  /** Point position in CSS pixels inside the plotting area. */
  x: number;
  y: number;
  text: string;
  width: number;
}

export interface PlacedLabel {
  text: string;
  left: number;
  top: number;
  width: number;
  /** The label sits away from its point; draw a line from the point to it. */
  leader: boolean;
  x: number;
  y: number;
  /** No free spot was left: the label is shown only on hover or keyboard focus of its point. */
  hidden: boolean;
}

interface Box {
  left: number;
  top: number;
  right: number;
  bottom: number;
}

const LABEL_HEIGHT = 16;
const POINT_RADIUS = 8;
const GAP = 4;

function intersects(a: Box, b: Box): boolean {
  return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
}

/** Points closer than `radius` pixels share one label ("fp32 · onnxruntime, fp32 · openvino"). */
export function mergeCoincident(anchors: LabelAnchor[], radius = 3, measure: (text: string) => number = (text) => text.length * 6.5): LabelAnchor[] {
  const merged: LabelAnchor[] = [];
  for (const anchor of anchors) {
    const twin = merged.find((other) => Math.abs(other.x - anchor.x) <= radius && Math.abs(other.y - anchor.y) <= radius);
    if (twin) {
      twin.text = `${twin.text}, ${anchor.text}`;
      twin.width = measure(twin.text);
    } else {
      merged.push({ ...anchor });
    }
  }
  return merged;
}

function candidates(anchor: LabelAnchor): { left: number; top: number; leader: boolean }[] {
  const right = anchor.x + POINT_RADIUS + GAP;
  const left = anchor.x - POINT_RADIUS - GAP - anchor.width;
  const centre = anchor.x - anchor.width / 2;
  const middle = anchor.y - LABEL_HEIGHT / 2;
  const above = anchor.y - POINT_RADIUS - LABEL_HEIGHT;
  const below = anchor.y + POINT_RADIUS;
  const near = [
    { left: right, top: middle }, { left: right, top: above }, { left: right, top: below },
    { left, top: middle }, { left, top: above }, { left, top: below },
    { left: centre, top: above }, { left: centre, top: below },
  ].map((spot) => ({ ...spot, leader: false }));
  // Further out, in steps of one label height, joined to the point by a leader line.
  const far = [];
  for (let step = 1; step <= 8; step += 1) {
    const offset = step * (LABEL_HEIGHT + GAP);
    far.push({ left: right, top: above - offset, leader: true }, { left: right, top: below + offset, leader: true });
    far.push({ left, top: above - offset, leader: true }, { left, top: below + offset, leader: true });
  }
  return [...near, ...far];
}

/**
 * Places one label per anchor inside a `width` x `height` plotting area, greedily, in the given
 * order (put the most important first): the first spot that overlaps no placed label, no point and
 * stays inside wins. When none does, the label is `hidden` (shown on hover or focus of its point) at the
 * least crowded spot, so that visible labels never overlap.
 */
export function placeLabels(anchors: LabelAnchor[], width: number, height: number): PlacedLabel[] {
  const pointBoxes: Box[] = anchors.map((anchor) => ({
    left: anchor.x - POINT_RADIUS, right: anchor.x + POINT_RADIUS, top: anchor.y - POINT_RADIUS, bottom: anchor.y + POINT_RADIUS,
  }));
  const placed: PlacedLabel[] = [];
  const placedBoxes: Box[] = [];
  for (const anchor of anchors) {
    let best: { left: number; top: number; leader: boolean; clashes: number } | null = null;
    for (const spot of candidates(anchor)) {
      const box = { left: spot.left, top: spot.top, right: spot.left + anchor.width, bottom: spot.top + LABEL_HEIGHT };
      if (box.left < 0 || box.top < 0 || box.right > width || box.bottom > height) continue;
      const clashes = placedBoxes.filter((other) => intersects(box, other)).length + pointBoxes.filter((other) => intersects(box, other)).length;
      if (clashes === 0) {
        best = { ...spot, clashes };
        break;
      }
      if (best === null || clashes < best.clashes) best = { ...spot, clashes };
    }
    const spot = best ?? { left: Math.max(0, Math.min(width - anchor.width, anchor.x + POINT_RADIUS)), top: Math.max(0, Math.min(height - LABEL_HEIGHT, anchor.y)), leader: false, clashes: 1 };
    const hidden = spot.clashes > 0;
    placed.push({ text: anchor.text, left: spot.left, top: spot.top, width: anchor.width, leader: spot.leader && !hidden, x: anchor.x, y: anchor.y, hidden });
    if (!hidden) placedBoxes.push({ left: spot.left, top: spot.top, right: spot.left + anchor.width, bottom: spot.top + LABEL_HEIGHT });
  }
  return placed;
}

export { LABEL_HEIGHT };

/** Axis tick labels with as many decimals as their spacing needs, so that no two ticks read alike. */
export function tickLabels(splits: number[]): string[] {
  const steps = splits.slice(1).map((value, index) => Math.abs(value - splits[index])).filter((step) => step > 0);
  const step = steps.length ? Math.min(...steps) : 1;
  const digits = Math.min(8, Math.max(0, Math.ceil(-Math.log10(step) + 1e-9)));
  return splits.map((value) => value.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: 0 }));
}
