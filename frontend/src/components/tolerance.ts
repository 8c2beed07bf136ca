import type { Tolerance } from '../api/types';

/** What a drop of 1% means for each metric: the unit the tolerance field names next to the number. */
const DROP_UNITS: Record<string, string> = {
  auto: "points of each primary output's metric (top-1 agreement, accuracy, IoU…)",
  accuracy: 'points of top-1 accuracy',
  cosine: 'of cosine similarity (1.00 → 0.99 is 1%)',
  top1_agreement: 'points of top-1 agreement with FP32',
  mask_iou: 'points of mask IoU',
  relative_l2: 'points of relative L2 error (a rise: 0.00 → 0.01 is 1%)',
  detection_f1: 'points of detection F1',
  mean_iou: 'points of mean IoU',
  sequence_accuracy: 'points of sequence accuracy',
  cer: 'points of character error rate (a rise)',
};

export function dropUnit(metric: string): string {
  return DROP_UNITS[metric] ?? `points of ${metric}`;
}

/** A percentage as typed ("1", "1%", " 0.5 % "): the number of percent, or null when it is not one. */
export function parsePercent(text: string): number | null {
  const match = /^\s*([+-]?(?:\d+(?:[.,]\d*)?|[.,]\d+))\s*%?\s*$/.exec(text);
  if (!match) return null;
  const value = Number(match[1].replace(',', '.'));
  return Number.isFinite(value) ? value : null;
}

/** The allowed drop as a fraction (what the API takes) from the percent typed, e.g. "1%" → 0.01. */
export function percentToFraction(percent: number): number {
  // Rounded so that 0.1 + 0.2 style noise never reaches the API (0.07 * 0.01 = 0.0007000000000000001).
  return Number((percent / 100).toPrecision(12));
}

export function fractionToPercent(fraction: number): string {
  return String(Number((fraction * 100).toPrecision(12)));
}

/** The first problem with a typed percentage, or null: checked at the field, as the user types. */
export function percentProblem(text: string): string | null {
  if (text.trim() === '') return 'Enter the largest allowed drop in percent, e.g. 1 for 1%.';
  const value = parsePercent(text);
  if (value === null) return `“${text.trim()}” is not a percentage; type a number such as 1 or 0.5 (meaning 1% or 0.5%).`;
  if (value < 0) return 'A drop cannot be negative: 0% allows no loss at all.';
  if (value > 100) return `${value}% is more than the whole scale: at most 100%.`;
  return null;
}

/** A word of caution for a value that parses but probably is not what was meant. */
export function percentWarning(text: string): string | null {
  const value = parsePercent(text);
  if (value === null || percentProblem(text)) return null;
  if (value > 0 && value < 0.1) return `${value}% is a very small drop (${percentToFraction(value)} as a fraction); the field is in percent, so 1 means 1%.`;
  if (value >= 20) return `${value}% lets a variant lose a fifth or more of its accuracy and still pass.`;
  return null;
}

/** A tolerance in words: a floor for SQNR (FP32 has none to drop from), a drop in percent for the rest. */
export function toleranceText(tolerance: Tolerance): string {
  if (tolerance.metric === 'sqnr') return `SQNR at least ${tolerance.min_value ?? 30} dB`;
  return `${tolerance.metric} may drop by at most ${fractionToPercent(tolerance.max_drop ?? 0.01)}%`;
}
