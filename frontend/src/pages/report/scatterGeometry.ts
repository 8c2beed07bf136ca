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
 * stays inside wins; when none does, the least crowded spot is used so that no label is dropped.
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
    const spot = best ?? { left: Math.max(0, Math.min(width - anchor.width, anchor.x + POINT_RADIUS)), top: Math.max(0, Math.min(height - LABEL_HEIGHT, anchor.y)), leader: false };
    placed.push({ text: anchor.text, left: spot.left, top: spot.top, width: anchor.width, leader: spot.leader, x: anchor.x, y: anchor.y });
    placedBoxes.push({ left: spot.left, top: spot.top, right: spot.left + anchor.width, bottom: spot.top + LABEL_HEIGHT });
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
