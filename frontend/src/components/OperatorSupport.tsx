/** Which operators each runtime runs natively, which fall back and which it cannot run, in the runtimes' own words. */
import type { SupportAnswer } from '../api/types';
import { StatusBadge } from './common';
import { DataTable } from './DataTable';

const VERDICTS: Record<SupportAnswer['verdict'], { status: string; label: string }> = {
  runs: { status: 'succeeded', label: 'Runs' },
  partial: { status: 'waiting_for_devices', label: 'Partly falls back' },
  cannot_run: { status: 'failed', label: 'Cannot run' },
  unknown: { status: 'pending', label: 'No answer' },
};

function total(counts: Record<string, number> | undefined): number {
  return Object.values(counts ?? {}).reduce((sum, count) => sum + count, 0);
}

/** "Conv ×3, Relu ×2" for the op types of one column, or a dash. */
export function opList(counts: Record<string, number> | undefined, limit = 6): string {
  const entries = Object.entries(counts ?? {});
  if (entries.length === 0) return '—';
  const shown = entries.slice(0, limit).map(([op, count]) => (count > 1 ? `${op} ×${count}` : op));
  return entries.length > limit ? `${shown.join(', ')} and ${entries.length - limit} more` : shown.join(', ');
}

export function OperatorSupportTable({ answers, showWhere }: { answers: SupportAnswer[]; showWhere?: boolean }) {
  return (
    // Cards on a phone, each figure named by its column, like every other table (components/DataTable).
    <DataTable
      className="table table-compact table-cards"
      testId="operator-support"
      columns={['Runtime', ...(showWhere ? ['Answered by'] : []), 'Verdict', 'Native', 'Falls back', 'Cannot run']}
    >
        {answers.map((answer) => {
          const verdict = VERDICTS[answer.verdict] ?? VERDICTS.unknown;
          return (
            <tr key={`${answer.where ?? ''}|${answer.backend}|${answer.version ?? ''}`} data-backend={answer.backend} data-verdict={answer.verdict}>
              <td>
                {answer.runtime ?? answer.backend} <span className="muted">{answer.version ?? ''}</span>
                {answer.device ? <div className="muted small">{answer.device}</div> : null}
              </td>
              {showWhere ? <td>{answer.where === 'server' ? 'this server' : answer.where}</td> : null}
              <td>
                <StatusBadge status={verdict.status} label={verdict.label} />
                {answer.reason ? <div className="small">{answer.reason}</div> : null}
              </td>
              <td title={opList(answer.native, 100)}>
                {total(answer.native)} <span className="muted small">{opList(answer.native)}</span>
              </td>
              <td title={(answer.nodes?.fallback ?? []).join(', ')}>{opList(answer.fallback)}</td>
              <td title={(answer.nodes?.unsupported ?? []).join(', ')}>{opList(answer.unsupported)}</td>
            </tr>
          );
        })}
    </DataTable>
  );
}
