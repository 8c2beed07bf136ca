import { describe, expect, it } from 'vitest';
import { accuracyScale, cropTo, keepInside, LABEL_HEIGHT, mergeCoincident, paddedRange, paretoFront, placeLabels, tickLabels, zoomAround, zoomWindow } from './scatterGeometry';

describe('axis ranges', () => {
  it('widens a flat range instead of returning a zero-width one', () => {
    const [low, high] = paddedRange(1, 1);
    expect(high - low).toBeGreaterThan(0);
    expect(paddedRange(0, 0)).toEqual([-1, 1]);
    expect(paddedRange(Number.NaN, 2)).toEqual([0, 1]);
    expect(paddedRange(0.02, 0.04, 0.2, 0)[0]).toBeCloseTo(0.016);
  });

  it('ignores a drag that is too thin to be a selection', () => {
    expect(zoomWindow(2, 1, [0, 10])).toEqual([1, 2]);
    expect(zoomWindow(1, 1.000001, [0, 10])).toBeNull();
  });
});

describe('point labels', () => {
  const box = (label: { left: number; top: number; width: number }) => ({ left: label.left, right: label.left + label.width, top: label.top, bottom: label.top + LABEL_HEIGHT });
  const overlap = (a: ReturnType<typeof box>, b: ReturnType<typeof box>) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;

  it('gives each of a crowd of nearby points a label that overlaps no other', () => {
    const anchors = Array.from({ length: 6 }, (_, index) => ({ x: 200 + index * 3, y: 100 + index * 2, text: `int8-variant-${index}`, width: 90 }));
    const placed = placeLabels(anchors, 500, 300);
    expect(placed).toHaveLength(6);
    expect(placed.every((label) => !label.hidden)).toBe(true);
    for (const [index, a] of placed.entries()) {
      expect(a.left).toBeGreaterThanOrEqual(0);
      expect(a.left + a.width).toBeLessThanOrEqual(500);
      for (const b of placed.slice(index + 1)) expect(overlap(box(a), box(b))).toBe(false);
    }
    expect(placed.some((label) => label.leader)).toBe(true);
  });

  it('hides (for hover and focus) the labels that would overlap in a plot too small for them all', () => {
    const anchors = Array.from({ length: 12 }, (_, index) => ({ x: 100, y: 10 + index * 5, text: `int8-percentile-keep-${index}`, width: 80 }));
    const placed = placeLabels(anchors, 300, 80);
    const shown = placed.filter((label) => !label.hidden);
    expect(shown.length).toBeGreaterThan(0);
    expect(placed.some((label) => label.hidden)).toBe(true);
    for (const [index, a] of shown.entries()) for (const b of shown.slice(index + 1)) expect(overlap(box(a), box(b))).toBe(false);
  });

  it('keeps labels inside the plot at its edges', () => {
    const [label] = placeLabels([{ x: 495, y: 2, text: 'fp32 · onnxruntime', width: 110 }], 500, 300);
    expect(label.left + label.width).toBeLessThanOrEqual(500);
    expect(label.top).toBeGreaterThanOrEqual(0);
  });

  it('names points that sit on one another in one label', () => {
    const merged = mergeCoincident([{ x: 10, y: 10, text: 'a', width: 6 }, { x: 11, y: 10, text: 'b', width: 6 }, { x: 40, y: 10, text: 'c', width: 6 }]);
    expect(merged.map((anchor) => anchor.text)).toEqual(['a, b', 'c']);
  });
});

describe('tick labels', () => {
  it('prints as many decimals as the spacing needs, so that ticks never read alike', () => {
    expect(tickLabels([0.021, 0.0215, 0.022, 0.0225])).toEqual(['0.021', '0.0215', '0.022', '0.0225']);
    expect(tickLabels([0.8, 1, 1.2])).toEqual(['0.8', '1', '1.2']);
    expect(tickLabels([0, 50, 100])).toEqual(['0', '50', '100']);
  });
});

describe('the accuracy axis fitted to the tolerance', () => {
  it('leaves a collapsed INT8 variant off the scale instead of stretching the axis to 0–1', () => {
    const values = [0.991, 0.985, 0.982, 0.31];
    const { range, outliers } = accuracyScale(values, 0.981, 0.991, false);
    expect(outliers).toEqual([3]);
    expect(range[0]).toBeGreaterThan(0.9);
    expect(range[0]).toBeLessThan(0.981);
    expect(range[1]).toBeGreaterThanOrEqual(0.991);
  });

  it('keeps a variant just past the tolerance on the scale (within reach) and reads error figures the other way', () => {
    expect(accuracyScale([0.99, 0.975], 0.98, 0.99, false).outliers).toEqual([]);
    const errors = accuracyScale([0.01, 0.015, 0.9], 0.02, 0.01, true);
    expect(errors.outliers).toEqual([2]);
    expect(errors.range[1]).toBeLessThan(0.9);
  });

  it('with no tolerance line, shows every value', () => {
    const { range, outliers } = accuracyScale([0.2, 0.9], null, null, false);
    expect(outliers).toEqual([]);
    expect(range[0]).toBeLessThan(0.2);
  });
});

describe('zoom bounded to the data', () => {
  it('moves a window inside the bounds and never shows more than them', () => {
    expect(keepInside([0.9, 1.1], [0, 1])[0]).toBeCloseTo(0.8);
    expect(keepInside([0.9, 1.1], [0, 1])[1]).toBe(1);
    expect(keepInside([-1, 3], [0, 1])).toEqual([0, 1]);
    expect(cropTo([0.5, 1.4], [0, 1])).toEqual([0.5, 1]);
    expect(cropTo([1.2, 1.4], [0, 1])).toBeNull();
  });

  it('zooms in around the point of interest, not the empty middle', () => {
    expect(zoomAround([0, 10], 0.5, 1, [0, 10])).toEqual([0, 5]);
    expect(zoomAround([0, 10], 0.5, 6, [0, 10])).toEqual([3.5, 8.5]);
    expect(zoomAround([0, 10], 0.5, null, [0, 10])).toEqual([2.5, 7.5]);
    expect(zoomAround([2, 4], 2, 3, [0, 10])).toEqual([1, 5]);
  });
});

describe('Pareto front', () => {
  it('keeps the variants no other beats on both latency and accuracy, fastest first', () => {
    const points = [
      { id: 'fp32', x: 10, y: 0.99 }, { id: 'int8', x: 3, y: 0.98 }, { id: 'int8-slow', x: 5, y: 0.97 }, { id: 'int4', x: 2, y: 0.5 },
    ];
    expect(paretoFront(points).map((point) => point.id)).toEqual(['int4', 'int8', 'fp32']);
    expect(paretoFront([{ id: 'a', x: 1, y: 0.1 }, { id: 'b', x: 2, y: 0.05 }], true).map((point) => point.id)).toEqual(['a', 'b']);
  });
});
