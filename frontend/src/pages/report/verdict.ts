/**
 * The decision as the page shows it. Every sentence comes from the server's one decision object
 * (workers/scoring.py `decide`); this module only picks which of its parts to show, never rewords them.
 */
import type { Decision, LatencyRatio, ReportDevice } from '../../api/types';

/** The device's decision: its one name on the wire (the server fills in a report stored before decisions). */
export function decisionOf(device: ReportDevice): Decision | null {
  return device.decision ?? null;
}

/** The verdict's one line; the device's reason when the server sent no decision. */
export function headline(device: ReportDevice): string {
  return decisionOf(device)?.text ?? device.reason ?? '';
}

/** The badge beside a verdict that rests on a tie (interval containing 1.0) with a faster-measured variant. */
export function tieBadge(decision: Decision): string | null {
  return decision.tie ? 'Tie within noise' : null;
}

/** The badge beside a verdict decided on rounds the device was busy in: Kiln re-times it once the device is quiet. */
export function provisionalBadge(decision: Decision): string | null {
  return decision.provisional ? 'Provisional: the device was busy' : null;
}

/** "1.03x (1.002x to 1.05x)": the server's own text for a ratio (the digits that decide it); two decimals for reports stored before it. */
export function ratioWords(ratio: LatencyRatio): string {
  if (ratio.ratio_text && ratio.interval_text) return `${ratio.ratio_text} (${ratio.interval_text})`;
  return `${ratio.ratio.toFixed(2)}x (${ratio.low.toFixed(2)}x to ${ratio.high.toFixed(2)}x)`;
}
