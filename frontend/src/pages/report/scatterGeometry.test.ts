import { describe, expect, it } from 'vitest';
import { LABEL_HEIGHT, mergeCoincident, paddedRange, placeLabels, tickLabels, zoomWindow } from './scatterGeometry';

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
    for (const [index, a] of placed.entries()) {
      expect(a.left).toBeGreaterThanOrEqual(0);
      expect(a.left + a.width).toBeLessThanOrEqual(500);
      for (const b of placed.slice(index + 1)) expect(overlap(box(a), box(b))).toBe(false);
    }
    expect(placed.some((label) => label.leader)).toBe(true);
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
