/** Wording of the recommendation: the speed-up with its noise, the accuracy cost, the tie. */
import type { LatencyRatio, ReportDevice, Verdict } from '../../api/types';

/** "1.10x (0.82x–1.46x)": a ratio with its 95% interval. */
export function ratioText(ratio: LatencyRatio): string {
  return `${ratio.ratio.toFixed(2)}x (${ratio.low.toFixed(2)}x–${ratio.high.toFixed(2)}x)`;
}

/**
 * A gap whose interval is too wide to call a tie (the server's `too_noisy`: high / low above 1.5),
 * worded as the server's verdict words it (workers/scoring.py `_too_noisy`).
 */
export function tooNoisyText(ratio: LatencyRatio): string {
  return `too noisy to tell: ${ratio.low.toFixed(2)}x to ${ratio.high.toFixed(2)}x; re-run on a quieter device`;
}

/** How much faster than FP32 the recommended variant is, and whether that is beyond the noise. */
export function speedupPhrase(verdict: Verdict): string {
  const speedup = verdict.speedup;
  if (!speedup) return verdict.label.startsWith('fp32') ? 'FP32 itself' : 'no FP32 to compare with';
  if (speedup.beyond_noise) return `${speedup.ratio.toFixed(2)}x faster than FP32`;
  if (speedup.too_noisy) return `${speedup.ratio.toFixed(2)}x FP32's speed: ${tooNoisyText(speedup)}`;
  return `${ratioText(speedup)} FP32's speed: a tie within noise`;
}

/** What the recommended variant costs in accuracy against FP32. */
export function costPhrase(verdict: Verdict): string {
  const { metric, value, drop } = verdict.accuracy;
  if (value === null || value === undefined) return 'accuracy not measured';
  if (drop === null || drop === undefined) return `${metric} ${Number(value.toPrecision(4))}`;
  if (drop <= 0) return 'no accuracy cost';
  return `costs ${Number(drop.toPrecision(2))} ${metric}`;
}

/** The tie in words, when a faster variant lost because its lead was inside the noise (or too noisy to tell). */
export function tiePhrase(verdict: Verdict): string | null {
  if (!verdict.tie || verdict.tied_with.length === 0) return null;
  const [first, ...rest] = verdict.tied_with;
  const more = rest.length > 0 ? ` and ${rest.length} more` : '';
  if (first.too_noisy) return `${first.label}${more} measured ${first.ratio.toFixed(2)}x faster, but ${tooNoisyText(first)}.`;
  return `A tie within noise: ${first.label}${more} measured ${ratioText(first)} faster, which the measured noise does not rule out being no faster at all.`;
}

/** The badge beside a verdict that rests on a gap the measurements could not settle; null when there is none. */
export function tieBadge(verdict: Verdict): string | null {
  if (!verdict.tie) return null;
  return verdict.tied_with[0]?.too_noisy ? 'Too noisy to tell' : 'Tie within noise';
}

/** The line shown when the server sent no verdict (reports stored before verdicts existed). */
export function headline(device: ReportDevice): string {
  return device.verdict?.text ?? device.reason ?? '';
}
