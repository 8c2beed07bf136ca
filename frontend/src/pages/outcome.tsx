/** A finished deployment's outcome in a few words: what each device should run and how much faster. */
import type { JobOutcome } from '../api/types';
import type { Column } from '../components/DataTable';

/** The headers of the two cells `OutcomeCells` fills. */
export const OUTCOME_COLUMNS: Column[] = ['Outcome', { label: 'Speed-up vs FP32', className: 'numeric' }];

/**
 * The decision's own short form ("2.41x faster", "1.04x (tie)", "0.91x (slower)", "FP32 itself"); for reports stored
 * before decisions, the bare ratio and "(within noise)" when it was not beyond it; "—" when nothing was measured.
 */
export function speedupCell(outcome: JobOutcome): string {
  if (outcome.speedup_text) return outcome.speedup_text;
  if (outcome.speedup === null || outcome.speedup === undefined) return outcome.tie ? 'tie within noise' : '—';
  if (outcome.beyond_noise) return `${outcome.speedup.toFixed(2)}x`;
  return `${outcome.speedup.toFixed(2)}x (within noise)`;
}

export function OutcomeCells({ outcome }: { outcome: JobOutcome[] | undefined }) {
  const rows = outcome ?? [];
  if (rows.length === 0) {
    return (
      <>
        <td className="muted">—</td>
        <td className="muted numeric">—</td>
      </>
    );
  }
  return (
    <>
      <td data-testid="job-outcome">
        {rows.map((row) => (
          <div key={row.device} title={row.verdict ?? undefined}>
            {row.recommended ?? 'no recommendation'}
            {rows.length > 1 ? <span className="muted small"> on {row.device}</span> : null}
          </div>
        ))}
      </td>
      <td className="numeric" data-testid="job-speedup">
        {rows.map((row) => (
          <div key={row.device}>{speedupCell(row)}</div>
        ))}
      </td>
    </>
  );
}
