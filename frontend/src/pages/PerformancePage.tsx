/** The performance database: every measurement across jobs, devices and toolchains, with filters and charts. */
import { useId, useMemo, useState } from 'react';
import { Link } from 'react-router';
import { PAGE_SIZE, rows, useAgents, useModels, usePerformance, type PerformanceFilters } from '../api/hooks';
import { PRECISIONS } from '../api/types';
import { BarList } from '../components/BarList';
import { EmptyState, ErrorMessage, PageHeader, Pager } from '../components/common';
import { DataTable } from '../components/DataTable';
import { ListStates } from '../components/ListStates';
import { formatDate, formatNumber } from '../format';
import { BUYING_RULE, buyingModel, compareJobs, devicesWithoutAPass, fastestPerDevice, jobsIn, jobsLike, p50ByToolchain } from './performance';

const CHART_ROWS = 500;
// A measurement stores the precision its build made: bf16 is FP32's build run under a bf16 hint (its effective precision).
const BUILD_PRECISIONS = PRECISIONS.filter((precision) => precision !== 'bf16');

function Filters({ filters, onChange }: { filters: PerformanceFilters; onChange: (next: PerformanceFilters) => void }) {
  const models = rows(useModels('', 1, 500).data);
  const agents = rows(useAgents().data);
  const ids = { model: useId(), agent: useId(), backend: useId(), precision: useId(), regression: useId() };
  const set = (patch: PerformanceFilters) => onChange({ ...filters, ...patch });
  return (
    <form className="filters" aria-label="Filters" onSubmit={(event) => event.preventDefault()}>
      <div className="field">
        <label htmlFor={ids.model}>Model</label>
        <select id={ids.model} value={filters.model ?? ''} onChange={(event) => set({ model: event.target.value ? Number(event.target.value) : null })}>
          <option value="">All models</option>
          {models.map((model) => (
            <option key={model.id} value={model.id}>
              {model.name}
            </option>
          ))}
        </select>
      </div>
      <div className="field">
        <label htmlFor={ids.agent}>Device</label>
        <select id={ids.agent} value={filters.agent ?? ''} onChange={(event) => set({ agent: event.target.value ? Number(event.target.value) : null })}>
          <option value="">All devices</option>
          {agents.map((agent) => (
            <option key={agent.id} value={agent.id}>
              {agent.name}
            </option>
          ))}
        </select>
      </div>
      <div className="field">
        <label htmlFor={ids.backend}>Backend</label>
        <select id={ids.backend} value={filters.backend ?? ''} onChange={(event) => set({ backend: event.target.value })}>
          <option value="">Any</option>
          <option value="onnxruntime">ONNX Runtime</option>
          <option value="openvino">OpenVINO</option>
        </select>
      </div>
      <div className="field">
        <label htmlFor={ids.precision}>Precision</label>
        <select id={ids.precision} value={filters.precision ?? ''} onChange={(event) => set({ precision: event.target.value })}>
          <option value="">Any</option>
          {BUILD_PRECISIONS.map((precision) => (
            <option key={precision} value={precision}>
              {precision}
            </option>
          ))}
        </select>
      </div>
      <div className="field field-checkbox">
        <label htmlFor={ids.regression}>
          <input id={ids.regression} type="checkbox" checked={!!filters.regression} onChange={(event) => set({ regression: event.target.checked })} data-testid="filter-regressions" />{' '}
          Regressions only
        </label>
      </div>
    </form>
  );
}

function JobComparison({ measurements }: { measurements: Parameters<typeof jobsIn>[0] }) {
  const jobs = jobsIn(measurements);
  const [picked, setPicked] = useState<{ job: number | null; earlier: number | null }>({ job: null, earlier: null });
  const job = picked.job ?? jobs[0] ?? null;
  // Only jobs of the same model: across models the ratios (7,624x) say nothing.
  const alike = job === null ? [] : jobsLike(measurements, job).filter((candidate) => candidate !== job);
  const earlier = picked.earlier !== null && alike.includes(picked.earlier) ? picked.earlier : alike[0] ?? null;
  const ids = { job: useId(), earlier: useId() };
  if (job === null) return <p className="muted">No job has measurements with these filters yet.</p>;
  const modelName = measurements.find((row) => row.job === job)?.model.name ?? 'this model';
  const jobPicker = (
    <div className="field">
      <label htmlFor={ids.job}>Job</label>
      <select id={ids.job} value={job} onChange={(event) => setPicked({ job: Number(event.target.value), earlier: null })} data-testid="compare-job">
        {jobs.map((id) => (
          <option key={id} value={id}>#{id} · {measurements.find((row) => row.job === id)?.model.name}</option>
        ))}
      </select>
    </div>
  );
  if (earlier === null) {
    return (
      <>
        <div className="filters">{jobPicker}</div>
        <p className="muted" data-testid="job-comparison-none">Job #{job} is the only job of {modelName} here: re-run it, or pick another job, to compare.</p>
      </>
    );
  }
  const table = compareJobs(measurements, job, earlier);
  return (
    <>
      <div className="filters">
        {jobPicker}
        <div className="field">
          <label htmlFor={ids.earlier}>Compared with (jobs of {modelName})</label>
          <select id={ids.earlier} value={earlier} onChange={(event) => setPicked({ ...picked, earlier: Number(event.target.value) })} data-testid="compare-earlier">
            {alike.map((id) => (
              <option key={id} value={id}>#{id}</option>
            ))}
          </select>
        </div>
      </div>
      <table className="table" data-testid="job-comparison">
        <thead>
          <tr>
            <th scope="col">Variant</th>
            <th scope="col">Device</th>
            <th scope="col" className="numeric">p50 #{earlier}</th>
            <th scope="col" className="numeric">p50 #{job}</th>
            <th scope="col" className="numeric">Ratio</th>
          </tr>
        </thead>
        <tbody>
          {table.map((row) => (
            <tr key={row.key}>
              <td>{row.variant} on {row.backend}</td>
              <td>{row.device}</td>
              <td className="numeric">{row.before === null ? '—' : `${formatNumber(row.before, 3)} ms`}</td>
              <td className="numeric">{row.after === null ? '—' : `${formatNumber(row.after, 3)} ms`}</td>
              <td className="numeric">{row.ratio === null ? '—' : `${formatNumber(row.ratio, 2)}x`}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}

export function PerformancePage() {
  const [filters, setFilters] = useState<PerformanceFilters>({});
  const [page, setPage] = useState(1);
  const table = usePerformance(filters, page);
  const all = usePerformance(filters, 1, CHART_ROWS);
  const measurements = useMemo(() => all.data?.results ?? [], [all.data]);
  const list = table.data?.results ?? [];
  // One model's measurements: the chosen model, or the one measured on the most devices.
  const buying = filters.model ? { name: measurements[0]?.model.name ?? 'this model', rows: measurements } : buyingModel(measurements);
  const devices = fastestPerDevice(buying?.rows ?? []);
  const unranked = devicesWithoutAPass(buying?.rows ?? []);
  const leftOut = devices.reduce((sum, pick) => sum + pick.fasterOutside, 0);
  const toolchains = p50ByToolchain(measurements);

  return (
    <>
      <PageHeader title="Performance" subtitle="Every measurement Kiln has made, across models, devices and toolchain versions." />
      <Filters
        filters={filters}
        onChange={(next) => {
          setFilters(next);
          setPage(1);
        }}
      />
      <ErrorMessage error={table.error} />
      <div className="grid-2">
        <section className="card" aria-labelledby="devices-heading">
          <h2 id="devices-heading">Fastest per device</h2>
          <p className="muted small" data-testid="device-chart-caption">
            Which device should I buy? For <strong>{buying?.name ?? 'a model'}</strong>
            {filters.model ? '' : ' (the model measured on the most devices; choose another model above)'}: the p50 of {BUYING_RULE}, on
            each device and runtime.
            {leftOut > 0 ? ` ${leftOut} faster variant${leftOut === 1 ? '' : 's'} outside the tolerance ${leftOut === 1 ? 'is' : 'are'} left out.` : ''}
          </p>
          {devices.length ? (
            <BarList
              testId="device-chart"
              ariaLabel="Fastest p50 within tolerance per device"
              data={devices.map((pick) => ({
                label: pick.label,
                value: pick.p50,
                display: `${formatNumber(pick.p50, pick.p50 < 10 ? 3 : 1)} ms`,
                title: pick.variant,
                detail: (
                  <span data-testid="device-pick">
                    {pick.variant}
                    {pick.recommended ? ' · recommended' : ''}
                    {pick.fasterOutside ? ` · ${pick.fasterOutside} faster outside the tolerance` : ''}
                  </span>
                ),
              }))}
            />
          ) : (
            <p className="muted">{buying ? 'No variant within its tolerance yet.' : 'No measurements yet.'}</p>
          )}
          {unranked.length ? (
            <p className="muted small" data-testid="device-chart-unranked">No variant within tolerance on {unranked.join(', ')}.</p>
          ) : null}
        </section>
        <section className="card" aria-labelledby="toolchain-heading">
          <h2 id="toolchain-heading">Across toolchain versions</h2>
          <p className="muted small">Median p50 per device and runtime version{filters.agent ? '' : ' (pick a device and a model to compare like with like)'}.</p>
          {toolchains.length ? (
            <BarList testId="toolchain-chart" ariaLabel="Median p50 per runtime version" data={toolchains.map((row) => ({ label: row.label, value: row.p50, display: `${formatNumber(row.p50, 3)} ms`, title: `${row.count} measurements` }))} />
          ) : (
            <p className="muted">No measurements yet.</p>
          )}
        </section>
      </div>
      <section className="card" aria-labelledby="compare-heading">
        <h2 id="compare-heading">A job against an earlier one</h2>
        <JobComparison measurements={measurements} />
      </section>
      <section className="card" aria-labelledby="rows-heading">
        <h2 id="rows-heading">Measurements</h2>
        <ListStates
          pending={table.isPending}
          empty={list.length === 0}
          whenEmpty={<EmptyState title="No measurements match.">Each device task that succeeds adds one, and it stays when its job is gone.</EmptyState>}
        >
          <DataTable
            columns={[
              'Job',
              'Model',
              'Variant',
              'Device',
              { label: 'Runtime', className: 'col-p3' },
              { label: 'p50', className: 'numeric' },
              { label: 'std', className: 'numeric col-p2' },
              'Accuracy',
              { label: 'Measured', className: 'col-p3' },
            ]}
            testId="performance-table"
            footer={<Pager page={page} count={table.data?.count ?? 0} pageSize={PAGE_SIZE} onPage={setPage} label="Measurements" />}
          >
            {list.map((row) => (
              <tr key={row.id} data-testid="performance-row">
                <td>{row.job ? <Link to={`/jobs/${row.job}/report`}>#{row.job}</Link> : '—'}</td>
                <td>{row.model.name}</td>
                <td>
                  <code>{row.variant_key}</code>
                </td>
                <td>{row.agent.name}</td>
                <td>
                  {row.backend} {row.backend_version}
                </td>
                <td className="numeric">
                  {formatNumber(row.p50_ms, 3)} ms
                  {row.regression?.flagged ? (
                    <div className="regression small" data-testid="regression-flag">
                      {formatNumber(row.regression.slowdown, 2)}x slower than #{row.regression.baseline_job}
                    </div>
                  ) : null}
                </td>
                <td className="numeric">{formatNumber(row.std_ms, 3)}</td>
                <td>{'metric' in row.accuracy && row.accuracy.value !== null && row.accuracy.value !== undefined ? `${row.accuracy.metric} ${formatNumber(row.accuracy.value as number, 4)}` : '—'}</td>
                <td>{formatDate(row.measured_at)}</td>
              </tr>
            ))}
          </DataTable>
        </ListStates>
      </section>
    </>
  );
}
