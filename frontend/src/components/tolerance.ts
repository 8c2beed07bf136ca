import type { Tolerance } from '../api/types';

/** A tolerance in words: a floor for SQNR (FP32 has none to drop from), a drop for the rest. */
export function toleranceText(tolerance: Tolerance): string {
  if (tolerance.metric === 'sqnr') return `SQNR at least ${tolerance.min_value ?? 30} dB`;
  return `${tolerance.metric} may drop by at most ${tolerance.max_drop ?? 0.01}`;
}
