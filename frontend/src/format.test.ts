import { describe, expect, it } from 'vitest';
import { formatRange, formatScale } from './format';

describe('numbers people read', () => {
  it('writes a scale as the fraction it is', () => {
    expect(formatScale(1 / 255)).toBe('1/255');
    expect(formatScale(0.0625)).toBe('1/16');
    expect(formatScale(0.3)).toBe(0.3);
    expect(formatScale(1)).toBe(1);
  });

  it('writes a range at the precision its width needs', () => {
    expect(formatRange(0, 334.7297)).toBe('0–335 ms');
    expect(formatRange(1.2, 1.5)).toBe('1.2–1.5 ms');
    expect(formatRange(0.0213, 0.0261)).toBe('0.0213–0.0261 ms');
  });
});
