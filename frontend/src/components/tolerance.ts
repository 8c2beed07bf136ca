import type { Tolerance } from '../api/types';

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

/**
 * How a figure's tolerance reads: `points` for scores on a 0–100% scale (agreement, accuracy, IoU, F1: 0.01 is one
 * percentage point), `fraction` for cosines (1.00 → 0.99), `rise` for errors FP32 has none of (relative L2, CER).
 */
type Scale = 'points' | 'fraction' | 'rise';

/** Each figure a tolerance can read (kiln_contract/contract.py METRICS), in words, with its scale and FP32's own value when fixed. */
const FIGURES: Record<string, { name: string; scale: Scale; ideal?: number }> = {
  top1_agreement: { name: 'top-1 agreement', scale: 'points', ideal: 1 },
  top5_agreement: { name: 'top-5 agreement', scale: 'points', ideal: 1 },
  id_agreement: { name: 'id agreement', scale: 'points', ideal: 1 },
  mask_iou: { name: 'mask IoU', scale: 'points', ideal: 1 },
  detection_f1: { name: 'detection F1', scale: 'points', ideal: 1 },
  top1_accuracy: { name: 'top-1 accuracy', scale: 'points' },
  top5_accuracy: { name: 'top-5 accuracy', scale: 'points' },
  mean_iou: { name: 'mean IoU', scale: 'points' },
  sequence_accuracy: { name: 'sequence accuracy', scale: 'points' },
  cosine: { name: 'cosine similarity', scale: 'fraction', ideal: 1 },
  cosine_p5: { name: 'cosine similarity (worst 5% of vectors)', scale: 'fraction', ideal: 1 },
  sentence_cosine_p5: { name: 'sentence cosine (worst 5%)', scale: 'fraction', ideal: 1 },
  relative_l2: { name: 'relative L2 error', scale: 'rise', ideal: 0 },
  cer: { name: 'character error rate', scale: 'rise' },
};

/** The figure each tolerance metric reads (kiln_contract/contract.py TOLERANCE_FIGURES); auto reads each primary output's own. */
const TOLERANCE_FIGURES: Record<string, string> = {
  accuracy: 'top1_accuracy', cosine: 'cosine', top1_agreement: 'top1_agreement', mask_iou: 'mask_iou', relative_l2: 'relative_l2',
  detection_f1: 'detection_f1', cer: 'cer', sequence_accuracy: 'sequence_accuracy', mean_iou: 'mean_iou',
};

export function figureName(figure: string): string {
  return FIGURES[figure]?.name ?? figure;
}

/** The figures a tolerance reads: its metric's, or for auto the primary outputs' (`autoFigures`, when known). */
function figuresOf(metric: string, autoFigures: string[] | null | undefined): string[] {
  if (metric !== 'auto') return [TOLERANCE_FIGURES[metric] ?? metric];
  return [...new Set(autoFigures ?? [])];
}

/** A number for reading: 1, 0.5, 0.25 (no float noise). */
function plain(value: number): string {
  return String(Number(value.toPrecision(6)));
}

/** "1 point", "0.5 points". */
export function pointsText(fraction: number): string {
  const points = plain(fraction * 100);
  return `${points} point${points === '1' ? '' : 's'}`;
}

/** What the typed percentage lets a variant lose, on this figure's own scale, with an example: never "0.01 points". */
function figureMeaning(percent: number, figure: string): string {
  const fraction = percentToFraction(percent);
  const { name, scale, ideal } = FIGURES[figure] ?? { name: figure, scale: 'points' as Scale };
  if (scale === 'fraction') return `${plain(percent)}% = ${plain(fraction)} of ${name}: FP32's 1.000 → ${plain(1 - fraction)} still passes.`;
  if (scale === 'rise') return `${plain(percent)}% = ${name} up to ${plain(fraction)} above FP32's${ideal === 0 ? ' (which is 0)' : ''} still passes.`;
  const from = ideal === 1 ? 100 : 90;
  return `${plain(percent)}% = ${pointsText(fraction)} of ${name}: with FP32 at ${from}%, a variant at ${plain(from - percent)}% still passes.`;
}

/** The tolerance field's meaning, for the metric chosen (auto: the figures it will read for this model and data, when known). */
export function dropMeaning(percent: number, metric: string, autoFigures?: string[] | null): string {
  const figures = figuresOf(metric, autoFigures);
  if (figures.length === 1) return figureMeaning(percent, figures[0]);
  const names = figures.length ? figures.map(figureName).join(' and ') : "each primary output's metric";
  return `${plain(percent)}% = ${pointsText(percentToFraction(percent))} of ${names} on their 0–100% scale (a cosine: ${plain(percentToFraction(percent))}).`;
}

/** A tolerance in words: a floor for SQNR (FP32 has none to drop from); a drop (or an error's rise) in points for scores. */
export function toleranceText(tolerance: Tolerance, autoFigures?: string[] | null): string {
  if (tolerance.metric === 'sqnr') return `SQNR at least ${tolerance.min_value ?? 30} dB`;
  const fraction = tolerance.max_drop ?? 0.01;
  const figures = figuresOf(tolerance.metric ?? 'auto', autoFigures);
  const scales = new Set(figures.map((figure) => FIGURES[figure]?.scale ?? 'points'));
  const only = scales.size === 1 ? [...scales][0] : null;
  if (tolerance.metric !== 'auto' && only !== 'points') {
    return `${tolerance.metric} may ${only === 'rise' ? 'rise' : 'drop'} by at most ${fractionToPercent(fraction)}%`;
  }
  const names = figures.length ? figures.map(figureName).join(' and ') : "each primary output's metric";
  if (only === 'fraction' || only === 'rise') return `${names} may ${only === 'rise' ? 'rise' : 'drop'} by at most ${plain(fraction)}`;
  return `${names} may drop by at most ${pointsText(fraction)}`;
}
