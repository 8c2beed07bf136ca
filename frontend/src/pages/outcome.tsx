/** A finished deployment's outcome in a few words: what each device should run and how much faster. */
import type { JobOutcome } from '../api/types';
import type { Column } from '../components/DataTable';

/** The headers of the two cells `OutcomeCells` fills. */
export const OUTCOME_COLUMNS: Column[] = ['Outcome', { label: 'Speed-up vs FP32', className: 'numeric' }];

/**
 * "2.41x" for a speed-up beyond the noise; "(within noise)" or "tie" inside it, "too noisy to tell" when its
 * interval was too wide to call it that; "—" when FP32 itself won or nothing was measured.
 */
export function speedupCell(outcome: JobOutcome): string {
  const unsettled = outcome.too_noisy ? 'too noisy to tell' : null;
  if (outcome.speedup === null || outcome.speedup === undefined) return outcome.tie ? (unsettled ?? 'tie within noise') : '—';
  if (outcome.beyond_noise) return `${outcome.speedup.toFixed(2)}x`;
  return `${outcome.speedup.toFixed(2)}x (${unsettled ?? 'within noise'})`;
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
