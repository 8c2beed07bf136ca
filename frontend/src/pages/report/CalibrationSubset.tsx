/** Which calibration samples the job used: how many of how many, drawn with which seed, stratified by
 * label or not, each label's share, and the first sample indices, so that a calibration can be redone. */
import type { CalibrationUsed, ReportDatasets } from '../../api/types';

export function drawnHow(used: CalibrationUsed, requested: ReportDatasets['calibration_subset']): string {
  if (used.seed === undefined || used.seed === null) {
    return requested ? 'chosen as requested' : 'the whole calibration set, in order';
  }
  const stratification = used.stratified
    ? 'stratified by label (each label keeps its share of the set)'
    : requested?.stratify === false
      ? 'not stratified (turned off)'
      : 'not stratified (the set has no labels)';
  return `drawn with seed ${used.seed}, ${stratification}`;
}

function LabelShares({ byLabel, samples }: { byLabel: Record<string, number>; samples: number }) {
  const labels = Object.entries(byLabel);
  if (labels.length === 0) return null;
  return (
    <table className="table" data-testid="calibration-labels">
      <thead>
        <tr>
          <th scope="col">Label</th>
          <th scope="col">Samples</th>
          <th scope="col">Share</th>
        </tr>
      </thead>
      <tbody>
        {labels.map(([label, count]) => (
          <tr key={label}>
            <td>{label}</td>
            <td>{count}</td>
            <td>{samples ? `${((100 * count) / samples).toFixed(1)}%` : '—'}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** The report's calibration section; nothing when the job calibrated nothing or used its set as it was. */
export function CalibrationSubset({ datasets }: { datasets?: ReportDatasets | null }) {
  const used = datasets?.calibration_used;
  const requested = datasets?.calibration_subset ?? null;
  if (!used && !requested) return null;
  return (
    <section className="card" aria-labelledby="calibration-heading" data-testid="calibration-subset">
      <h2 id="calibration-heading">Calibration samples</h2>
      {used ? (
        <>
          <p data-testid="calibration-summary">
            <strong>{used.samples}</strong> of {used.of} samples ({used.calls} call{used.calls === 1 ? '' : 's'}),{' '}
            {drawnHow(used, requested)}.
          </p>
          {used.by_label ? <LabelShares byLabel={used.by_label} samples={used.samples} /> : null}
          {used.indices && used.indices.length > 0 ? (
            <p className="small" data-testid="calibration-indices">
              Samples used (index in the calibration set
              {used.samples > used.indices.length ? `, the first ${used.indices.length} of ${used.samples}` : ''}):{' '}
              <code>{used.indices.join(', ')}</code>
            </p>
          ) : null}
        </>
      ) : (
        <p className="muted" data-testid="calibration-summary">
          {requested?.count} samples will be drawn with seed {requested?.seed ?? 0} when the job calibrates.
        </p>
      )}
    </section>
  );
}
