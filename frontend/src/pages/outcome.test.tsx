import { partial } from '../test/partial';
import { describe, expect, it } from 'vitest';
import type { JobOutcome } from '../api/types';
import { speedupCell } from './outcome';

const base = partial<JobOutcome>({
  device: 'box', agent: 1, recommended: 'int8 · int8-mse on onnxruntime', speedup: 2.41, comparison: 'faster', speedup_text: '2.41x faster',
  beyond_noise: true, tie: false, accuracy: null, verdict: null,
});

describe('speed-up cell of the deployments list', () => {
  it('shows the decision\'s own words, in the interval language', () => {
    expect(speedupCell(base)).toBe('2.41x faster');
    expect(speedupCell({ ...base, speedup: 1.04, comparison: 'tie', speedup_text: '1.04x (tie)' })).toBe('1.04x (tie)');
    expect(speedupCell({ ...base, speedup: 0.91, comparison: 'slower', speedup_text: '0.91x (slower)' })).toBe('0.91x (slower)');
    expect(speedupCell({ ...base, speedup: null, comparison: null, speedup_text: 'FP32 itself' })).toBe('FP32 itself');
  });

  it('reads reports stored before decisions', () => {
    expect(speedupCell({ ...base, speedup_text: null })).toBe('2.41x');
    expect(speedupCell({ ...base, speedup_text: null, speedup: 1.1, beyond_noise: false })).toBe('1.10x (within noise)');
    expect(speedupCell({ ...base, speedup_text: null, speedup: null, beyond_noise: null, tie: true })).toBe('tie within noise');
    expect(speedupCell({ ...base, speedup_text: null, speedup: null, beyond_noise: null })).toBe('—');
  });
});
