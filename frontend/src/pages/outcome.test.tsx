import { describe, expect, it } from 'vitest';
import type { JobOutcome } from '../api/types';
import { speedupCell } from './outcome';

const base: JobOutcome = {
  device: 'box', agent: 1, recommended: 'int8 on onnxruntime', speedup: 2.41, beyond_noise: true, tie: false, too_noisy: false,
  accuracy: null, verdict: null,
};

describe('speed-up cell of the deployments list', () => {
  it('says a gap with too wide an interval is too noisy to tell, not a tie', () => {
    expect(speedupCell(base)).toBe('2.41x');
    expect(speedupCell({ ...base, speedup: 1.1, beyond_noise: false })).toBe('1.10x (within noise)');
    expect(speedupCell({ ...base, speedup: 1.1, beyond_noise: false, too_noisy: true })).toBe('1.10x (too noisy to tell)');
    expect(speedupCell({ ...base, speedup: null, beyond_noise: null, tie: true })).toBe('tie within noise');
    expect(speedupCell({ ...base, speedup: null, beyond_noise: null, tie: true, too_noisy: true })).toBe('too noisy to tell');
    expect(speedupCell({ ...base, speedup: null, beyond_noise: null })).toBe('—');
  });
});
