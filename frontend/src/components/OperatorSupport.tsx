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

/** The native column: a count and the op types, or, where the runtime lists none, why (never "0 —"). */
function NativeCell({ answer }: { answer: SupportAnswer }) {
  const count = total(answer.native);
  if (count > 0) {
    // One element: in a phone's card the cell is a flex row, and a bare number beside a span would be squeezed to a digit a line.
    return (
      <span className="support-native">
        <span className="nowrap">{count}</span> <span className="muted small">{opList(answer.native)}</span>
      </span>
    );
  }
  if (answer.verdict === 'cannot_run') return <span className="muted small">none</span>;
  return <span className="muted small">not itemised by {answer.runtime ?? answer.backend}{answer.source ? ` (${answer.source})` : ''}</span>;
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
                {/* One child per cell: a phone's card lays a cell out as a flex row, which would squeeze loose pieces apart. */}
                <div className="cell-value">
                  {answer.runtime ?? answer.backend} <span className="muted nowrap">{answer.version ?? ''}</span>
                  {answer.device ? <div className="muted small">{answer.device}</div> : null}
                </div>
              </td>
              {showWhere ? <td>{answer.where === 'server' ? 'this server' : answer.where}</td> : null}
              <td>
                <div className="cell-value">
                  <StatusBadge status={verdict.status} label={verdict.label} />
                  {answer.reason ? <div className="small">{answer.reason}</div> : null}
                </div>
              </td>
              <td title={opList(answer.native, 100)} data-testid="support-native">
                <NativeCell answer={answer} />
              </td>
              <td title={(answer.nodes?.fallback ?? []).join(', ')}>{opList(answer.fallback)}</td>
              <td title={(answer.nodes?.unsupported ?? []).join(', ')}>{opList(answer.unsupported)}</td>
            </tr>
          );
        })}
    </DataTable>
  );
}
