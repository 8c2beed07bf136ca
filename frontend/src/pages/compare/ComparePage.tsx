/** Compare two deployments side by side (same model or same device), with CSV export. */
import { useId } from 'react';
import { Link, useSearchParams } from 'react-router';
import { rows, useJob, useJobs, useReport } from '../../api/hooks';
import { ErrorMessage, Loading, PageHeader } from '../../components/common';
import { DataTable } from '../../components/DataTable';
import { CsvButton } from '../../components/csv';
import { formatMs, formatNumber } from '../../format';
import { compareReports, sharedGround } from './compare';

function JobPicker({ label, value, onChange, testId }: { label: string; value: number | null; onChange: (id: number | null) => void; testId: string }) {
  const jobs = useJobs(1);
  const id = useId();
  const finished = rows(jobs.data).filter((job) => job.status === 'succeeded');
  return (
    <div className="field">
      <label htmlFor={id}>{label}</label>
      <select id={id} value={value ?? ''} onChange={(event) => onChange(event.target.value ? Number(event.target.value) : null)} data-testid={testId}>
        <option value="">Choose a finished deployment</option>
        {finished.map((job) => (
          <option key={job.id} value={job.id}>
            #{job.id} · {job.model?.name ?? `version ${job.model_version}`}
            {job.outcome?.length ? ` · ${job.outcome.map((row) => row.device).join(', ')}` : ''}
          </option>
        ))}
      </select>
    </div>
  );
}

export function ComparePage() {
  const [params, setParams] = useSearchParams();
  const a = Number(params.get('a')) || null;
  const b = Number(params.get('b')) || null;
  const jobA = useJob(a ?? 0);
  const jobB = useJob(b ?? 0);
  const reportA = useReport(a ?? 0, !!a);
  const reportB = useReport(b ?? 0, !!b);
  const choose = (side: 'a' | 'b') => (id: number | null) => {
    const next = new URLSearchParams(params);
    if (id) next.set(side, String(id));
    else next.delete(side);
    setParams(next, { replace: true });
  };
  const ready = !!a && !!b && reportA.data && reportB.data;
  const compared = ready ? compareReports(reportA.data, reportB.data) : [];
  const header = ['variant', 'backend', 'device', `p50 ms #${a}`, `p50 ms #${b}`, 'ratio', `accuracy #${a}`, `accuracy #${b}`, 'recommended in'];
  const csvRows = compared.map((row) => [
    row.variant, row.backend, row.device, row.a?.latency_ms?.p50, row.b?.latency_ms?.p50, row.ratio,
    row.a?.accuracy?.value, row.b?.accuracy?.value, row.recommendedIn.map((side) => `#${side === 'a' ? a : b}`).join(' '),
  ]);
  return (
    <>
      <PageHeader title="Compare deployments" subtitle="Two deployments side by side: the same model on two devices, or two models on one device." />
      <section className="card">
        <div className="form-row">
          <JobPicker label="Deployment A" value={a} onChange={choose('a')} testId="compare-a" />
          <JobPicker label="Deployment B" value={b} onChange={choose('b')} testId="compare-b" />
        </div>
      </section>
      <ErrorMessage error={reportA.error ?? reportB.error} />
      {!a || !b ? (
        <p className="muted">Choose two deployments.</p>
      ) : !ready ? (
        <Loading />
      ) : (
        <section className="card" aria-labelledby="comparison-heading" data-testid="comparison">
          <div className="section-header">
            <h2 id="comparison-heading">
              <Link to={`/jobs/${a}/report`}>#{a}</Link> vs <Link to={`/jobs/${b}/report`}>#{b}</Link>
            </h2>
            <CsvButton filename={`kiln-compare-${a}-${b}.csv`} header={header} rows={csvRows} />
          </div>
          <p className="muted small" data-testid="compare-ground">{sharedGround(jobA.data, jobB.data, compared)}</p>
          <DataTable
            columns={[
              'Variant',
              'Device',
              ...[`p50 #${a}`, `p50 #${b}`, `#${b} / #${a}`, `Accuracy #${a}`, `Accuracy #${b}`].map((label) => ({ label, className: 'numeric' })),
            ]}
            testId="compare-table"
          >
            {compared.map((row) => (
              <tr key={row.key} data-testid="compare-row">
                <td>
                  {row.variant} · {row.backend}
                  {row.recommendedIn.map((side) => (
                    <span key={side} className="badge badge-recommended">recommended in #{side === 'a' ? a : b}</span>
                  ))}
                </td>
                <td>{row.device}</td>
                <td className="numeric">{formatMs(row.a?.latency_ms?.p50)}</td>
                <td className="numeric">{formatMs(row.b?.latency_ms?.p50)}</td>
                <td className="numeric">{row.ratio === null ? "—" : `${row.ratio.toFixed(2)}x`}</td>
                <td className="numeric">{formatNumber(row.a?.accuracy?.value ?? null, 4)}</td>
                <td className="numeric">{formatNumber(row.b?.accuracy?.value ?? null, 4)}</td>
              </tr>
            ))}
          </DataTable>
        </section>
      )}
    </>
  );
}
