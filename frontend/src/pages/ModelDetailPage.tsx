/** One model: its versions, the selected version's signature, operators, size and validation. */
import { useEffect, useId, useState } from 'react';
import { Link, useNavigate, useParams } from 'react-router';
import { useQueryClient } from '@tanstack/react-query';
import { rows, useDeleteModel, useEstimate, useJobs, useModel, useCanWrite, useSetOutputKinds } from '../api/hooks';
import { IdenticalNotice } from './ModelsPage';
import { OUTCOME_COLUMNS, OutcomeCells } from './outcome';
import { type ModelEstimate, type ModelVersion, type ModelVersionCreated, type OutputKind, type TensorSpec } from '../api/types';
import { BarList } from '../components/BarList';
import { OperatorSupportTable } from '../components/OperatorSupport';
import { EmptyState, ErrorMessage, Loading, PageHeader, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { ListStates } from '../components/ListStates';
import { UploadZone } from '../components/UploadZone';
import { formatBytes, formatDate, formatNumber, formatRange, formatShape } from '../format';
import { KIND_LABELS, kindLabel, OUTPUT_KINDS } from '../components/outputKinds';

function SignatureTable({ caption, tensors, testId }: { caption: string; tensors: TensorSpec[]; testId: string }) {
  return (
    <table className="table table-compact table-cards" data-testid={testId}>
      <caption>{caption}</caption>
      <thead>
        <tr>
          <th scope="col">Name</th>
          <th scope="col">Type</th>
          <th scope="col">Shape</th>
        </tr>
      </thead>
      <tbody>
        {tensors.length === 0 ? (
          <tr>
            <td colSpan={3} className="muted">
              None
            </td>
          </tr>
        ) : (
          tensors.map((tensor) => (
            <tr key={tensor.name}>
              <td data-label="Name">
                <code>{tensor.name}</code>
              </td>
              <td data-label="Type">{tensor.dtype}</td>
              <td data-label="Shape">
                <code>{formatShape(tensor.shape)}</code>
              </td>
            </tr>
          ))
        )}
      </tbody>
    </table>
  );
}

/** How Kiln judges each output, why it thinks so, and a way to say otherwise. */
export function OutputKinds({ modelId, version }: { modelId: number; version: ModelVersion }) {
  const canWrite = useCanWrite();
  const setKinds = useSetOutputKinds(modelId, version.number);
  const kinds = version.output_kinds ?? {};
  const outputs = version.signature?.outputs ?? [];
  return (
    <section className="card" aria-labelledby="kinds-heading" data-testid="output-kinds">
      <h2 id="kinds-heading">Output kinds</h2>
      <p className="muted small">
        Each output is judged by the metric of its kind. Kiln infers the kind from the graph; change it if it is wrong.
      </p>
      <table className="table table-compact table-cards">
        <thead>
          <tr>
            <th scope="col">Output</th>
            <th scope="col">Kind</th>
            <th scope="col">Judged by</th>
          </tr>
        </thead>
        <tbody>
          {outputs.map((output) => {
            const info = kinds[output.name];
            const kind = info?.kind ?? null;
            return (
              <tr key={output.name} data-testid="output-kind-row">
                <td data-label="">
                  <code>{output.name}</code>
                  <div className="muted small">
                    {info?.overridden ? `set by you; Kiln inferred ${kindLabel(info.inferred)}` : info?.reason}
                  </div>
                </td>
                <td data-label="Kind">
                  <select
                    aria-label={`Kind of ${output.name}`}
                    value={kind ?? ''}
                    disabled={!canWrite || setKinds.isPending}
                    onChange={(event) => setKinds.mutate({ [output.name]: event.target.value || null })}
                  >
                    {kind === null ? <option value="">{kindLabel(null)}</option> : null}
                    {OUTPUT_KINDS.map((option) => (
                      <option key={option} value={option}>
                        {KIND_LABELS[option].label}
                        {option === info?.inferred && info?.overridden ? ' (inferred)' : ''}
                      </option>
                    ))}
                  </select>
                  {info?.overridden ? (
                    <button
                      type="button"
                      className="button button-small"
                      disabled={!canWrite || setKinds.isPending}
                      onClick={() => setKinds.mutate({ [output.name]: null })}
                    >
                      Use inferred
                    </button>
                  ) : null}
                </td>
                <td className="small" data-label="Judged by">{kind ? KIND_LABELS[kind as OutputKind]?.metric : '—'}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <ErrorMessage error={setKinds.error} />
    </section>
  );
}

function OpHistogram({ histogram }: { histogram: Record<string, number> }) {
  const entries = Object.entries(histogram ?? {}).sort((a, b) => b[1] - a[1]);
  if (entries.length === 0) return <p className="muted">No operator counts recorded.</p>;
  const total = entries.reduce((sum, [, count]) => sum + count, 0);
  return (
    <div>
      <p className="muted small">
        {total} nodes, {entries.length} operator types
      </p>
      <BarList
        data={entries.map(([op, count]) => ({ label: op, value: count }))}
        ariaLabel="Operator histogram"
        testId="op-histogram"
      />
    </div>
  );
}

function VersionDetail({ modelId, version }: { modelId: number; version: ModelVersion }) {
  const validation = version.validation;
  return (
    <>
    <div className="grid-2">
      <section className="card" aria-labelledby="signature-heading" data-testid="signature">
        <h2 id="signature-heading">Signature</h2>
        <SignatureTable caption="Inputs" tensors={version.signature?.inputs ?? []} testId="signature-inputs" />
        <SignatureTable caption="Outputs" tensors={version.signature?.outputs ?? []} testId="signature-outputs" />
      </section>
      <OutputKinds modelId={modelId} version={version} />
      <div className="stack">
        <section className="card" aria-labelledby="facts-heading">
          <h2 id="facts-heading">Version {version.number}</h2>
          <dl className="facts">
            <dt>Validation</dt>
            <dd data-testid="validation-result">
              {validation ? (
                validation.ok ? (
                  <StatusBadge status="succeeded" label="Valid" />
                ) : (
                  <>
                    <StatusBadge status="failed" label="Invalid" /> <span>{validation.error}</span>
                  </>
                )
              ) : (
                <span className="muted">Not checked</span>
              )}
            </dd>
            <dt>File</dt>
            <dd>
              {version.filename} ({version.source_format})
            </dd>
            {version.conversion?.exporter ? (
              <>
                <dt>Export to ONNX</dt>
                <dd data-testid="model-conversion">
                  {version.conversion.exporter === 'dynamo' ? 'torch.onnx dynamo exporter' : 'TorchScript-based exporter'}
                  {version.conversion.parity
                    ? `; parity ${version.conversion.parity.passed ? 'passed' : 'failed'}, min cosine ${version.conversion.parity.min_cosine.toFixed(6)}`
                    : ''}
                  {version.conversion.fallback_reason ? (
                    <div className="muted">dynamo exporter failed: {version.conversion.fallback_reason}</div>
                  ) : null}
                </dd>
              </>
            ) : null}
            <dt>Size</dt>
            <dd data-testid="model-size">{formatBytes(version.size_bytes)}</dd>
            <dt>Parameters</dt>
            <dd data-testid="parameter-count">
              {version.parameter_count ? formatNumber(version.parameter_count, 0) : <span className="muted" title="Counted from the weights stored in the graph; this version was read before weights held in Constant nodes were counted.">not counted</span>}
            </dd>
            <dt>Opset</dt>
            <dd>{version.opset ?? '—'}</dd>
            <dt>SHA-256</dt>
            <dd>
              <code className="hash" title={version.sha256}>
                {version.sha256?.slice(0, 16)}…
              </code>
            </dd>
            <dt>Uploaded</dt>
            <dd>{formatDate(version.created_at)}</dd>
          </dl>
          <div className="button-row">
            <Link
              className="button button-primary"
              to={`/deployments/new?model=${modelId}&version=${version.id}`}
              data-testid="deploy-version"
            >
              Deploy this version
            </Link>
            <Link className="button" to={`/datasets?model=${modelId}`} data-testid="add-data-for-model">
              Add data for it (images, WAV…)
            </Link>
            {version.download_url ? (
              <a className="button" href={version.download_url} download>
                Download
              </a>
            ) : null}
          </div>
        </section>
        <section className="card" aria-labelledby="ops-heading">
          <h2 id="ops-heading">Operators</h2>
          <OpHistogram histogram={version.op_histogram} />
        </section>
      </div>
    </div>
    {/* Full width: five or four columns of operator lists, figures and notes do not fit half of a 1366 px window. */}
    <OperatorSupport modelId={modelId} version={version} />
    <LatencyEstimate versionId={version.id} />
    </>
  );
}

const SUPPORT_POLL_MS = 3000;
// The server asks its runtimes right after an upload; a page opened then looks again until they have answered.
const SUPPORT_WAIT_MS = 3 * 60 * 1000;

/** Each runtime's own answer about this version's operators: the server's at upload, each device's from its jobs. */
function OperatorSupport({ modelId, version }: { modelId: number; version: ModelVersion }) {
  const client = useQueryClient();
  const answers = version.operator_support?.answers ?? [];
  const waiting = answers.length === 0 && Date.now() - new Date(version.created_at).getTime() < SUPPORT_WAIT_MS;
  useEffect(() => {
    if (!waiting) return undefined;
    const timer = window.setInterval(() => client.invalidateQueries({ queryKey: ['models', modelId] }), SUPPORT_POLL_MS);
    return () => window.clearInterval(timer);
  }, [waiting, client, modelId]);
  return (
    <section className="card" aria-labelledby="support-heading" data-testid="model-operator-support">
      <h2 id="support-heading">Operator support</h2>
      {answers.length ? (
        <>
          <OperatorSupportTable answers={answers} showWhere />
          <p className="muted small">
            From each runtime itself (ONNX Runtime&apos;s node placement, OpenVINO&apos;s reader and query), on this server and on the devices that ran
            it. A job skips a runtime that cannot run the model, before building anything for it.
          </p>
        </>
      ) : waiting ? (
        <p className="muted" role="status">
          <span className="spinner" aria-hidden="true" /> Asking the server&apos;s runtimes which operators they run…
        </p>
      ) : (
        <p className="muted">No runtime has answered for this version yet; the next deployment asks them before it builds anything.</p>
      )}
    </section>
  );
}

export interface EstimateRow {
  key: string;
  device: string;
  backend: string;
  /** Null where the device measured this model but has no measurement of another model to estimate from. */
  estimateMs: number | null;
  /** The estimate's range, and the factor either way it spans. */
  lowMs: number | null;
  highMs: number | null;
  factor: number | null;
  /** Models of the device each predicted from the others to set the range (0: a prior, nothing to check against). */
  checkedModels: number;
  coverage: number | null;
  models: number;
  /** The newest FP32 measurement of this model on the device, when one exists: it wins over any estimate. */
  measuredMs: number | null;
  /** Estimate over measurement, when both exist. */
  ratio: number | null;
}

/** How far off an estimate may be before it is called out as such beside the measurement. */
const ESTIMATE_OFF_BY = 2;

/** The estimate per device beside what was measured there, measurements first. */
export function estimateRows(estimate: ModelEstimate): EstimateRow[] {
  const estimated = new Set(estimate.devices.map((row) => `${row.agent.name}|${row.backend}`));
  const seen = new Set<string>();
  // The newest measurement per device and backend (the answer is newest first) where nothing was estimated.
  const measuredOnly = estimate.measured.filter((row) => {
    const key = `${row.agent_name}|${row.backend}`;
    if (estimated.has(key) || seen.has(key)) return false;
    seen.add(key);
    return true;
  });
  return estimate.devices
    .map((row): EstimateRow => {
      const measured = estimate.measured.find((candidate) => candidate.agent_name === row.agent.name && candidate.backend === row.backend);
      const measuredMs = measured && Number.isFinite(measured.p50_ms) ? measured.p50_ms : null;
      return {
        key: `${row.device}-${row.backend}`, device: row.agent.name, backend: row.backend, estimateMs: row.p50_ms, coverage: row.coverage, models: row.models,
        lowMs: row.low_ms ?? null, highMs: row.high_ms ?? null, factor: row.factor ?? null, checkedModels: row.checked_models ?? 0,
        measuredMs, ratio: measuredMs ? row.p50_ms / measuredMs : null,
      };
    })
    .concat(measuredOnly.map((row) => ({
      key: `${row.agent_name}-${row.backend}`, device: row.agent_name, backend: row.backend, estimateMs: null, coverage: null, models: 0,
      lowMs: null, highMs: null, factor: null, checkedModels: 0, measuredMs: row.p50_ms, ratio: null,
    })))
    .sort((a, b) => Number(b.measuredMs !== null) - Number(a.measuredMs !== null) || a.device.localeCompare(b.device));
}

/** How sure the estimate is, from the device's own record: its range and what set it. */
export function uncertaintyNote(row: EstimateRow): string | null {
  if (row.estimateMs === null || row.factor === null) return null;
  const factor = formatNumber(row.factor, row.factor < 2 ? 2 : 1);
  const basis = row.checkedModels > 0
    ? `the worst miss when each of the ${row.checkedModels} models measured here was predicted from the others`
    : 'only one other model was measured here, so nothing checks the fit yet';
  const kind = (row.coverage ?? 1) < 0.5 ? '; most of its operator types never ran on this device (a new kind of model)' : '';
  return `within ${factor}x either way: ${basis}${kind}`;
}

function estimateNote(row: EstimateRow): string {
  if (row.estimateMs === null) return 'no estimate: no other model was measured here';
  if (row.ratio === null) return uncertaintyNote(row) ?? 'estimate';
  if (row.ratio > ESTIMATE_OFF_BY || row.ratio < 1 / ESTIMATE_OFF_BY) {
    return `the estimate was ${formatNumber(row.ratio > 1 ? row.ratio : 1 / row.ratio, 1)}x ${row.ratio > 1 ? 'too slow' : 'too fast'}: trust the measurement`;
  }
  return `the estimate was within ${ESTIMATE_OFF_BY}x`;
}

/** FP32 latency per known device: measured where a job ran, else predicted from per-operator timings of other models. */
function LatencyEstimate({ versionId }: { versionId: number }) {
  const estimate = useEstimate(versionId);
  const table = estimate.data ? estimateRows(estimate.data) : [];
  return (
    <section className="card" aria-labelledby="estimate-heading" data-testid="latency-estimate">
      <h2 id="estimate-heading">FP32 latency per device</h2>
      {estimate.isPending ? <Loading /> : null}
      <ErrorMessage error={estimate.error} />
      {estimate.data && table.length === 0 ? (
        <p className="muted">No device has measured another model yet; the estimate appears once one has.</p>
      ) : null}
      {table.length > 0 ? (
        <DataTable
          columns={[
            'Device',
            { label: 'Measured p50', className: 'numeric' },
            { label: 'Estimated p50', className: 'numeric' },
            { label: 'Estimate from', title: "The share of this model's work whose operator types were timed on the device", className: 'col-p2' },
          ]}
        >
          {table.map((row) => (
            <tr key={row.key} data-testid="estimate-row">
              <td>
                <div className="cell-value">
                  {row.device} <span className="muted small">{row.backend}</span>
                </div>
              </td>
              <td className="numeric" data-testid="estimate-measured">{row.measuredMs === null ? '—' : `${formatNumber(row.measuredMs, 3)} ms`}</td>
              <td className="numeric" data-testid="estimate-value">
                <div className="cell-value">
                  {row.estimateMs === null ? '—' : <span className={`nowrap${row.measuredMs === null ? '' : ' muted'}`}>{formatNumber(row.estimateMs, 3)} ms</span>}
                  {row.lowMs !== null && row.highMs !== null ? (
                    <div className="small estimate-range" data-testid="estimate-range">
                      {formatRange(row.lowMs, row.highMs)}
                    </div>
                  ) : null}
                  <div className="muted small" data-testid="estimate-note">{estimateNote(row)}</div>
                </div>
              </td>
              <td className="col-p2">{row.coverage === null ? '—' : `${Math.round(row.coverage * 100)}% of the work, ${row.models} model${row.models === 1 ? '' : 's'}`}</td>
            </tr>
          ))}
        </DataTable>
      ) : null}
      <p className="muted small">
        Measured: the newest FP32 p50 of this model on the device. Estimated: predicted before any job runs from what operators cost on
        the device in other models (a cost per node and per unit of work, fitted on their per-operator or whole-model timings), with the
        range the device&apos;s own record allows: each model measured there predicted from the others, the worst miss either way.
      </p>
    </section>
  );
}

/** Every deployment of this model, newest first, with what each recommended. */
export function ModelDeployments({ modelId }: { modelId: number }) {
  const jobs = useJobs(1, modelId);
  const list = rows(jobs.data);
  return (
    <section className="card" aria-labelledby="deployments-heading" data-testid="model-deployments">
      <div className="section-header">
        <h2 id="deployments-heading">Deployments</h2>
        <Link to="/deployments/new" className="button button-small">New deployment</Link>
      </div>
      <ListStates
        error={jobs.error}
        pending={jobs.isPending}
        empty={list.length === 0}
        whenEmpty={<p className="muted">No deployment of this model yet.</p>}
      >
        <DataTable columns={['Job', 'Version', 'Status', ...OUTCOME_COLUMNS, 'Started']}>
          {list.map((job) => (
            <tr key={job.id} data-testid="model-deployment-row">
              <td><Link to={`/jobs/${job.id}`}>#{job.id}</Link></td>
              <td>v{job.model?.version ?? "?"}</td>
              <td><StatusBadge status={job.status} /></td>
              <OutcomeCells outcome={job.outcome} />
              <td>{formatDate(job.created_at)}</td>
            </tr>
          ))}
        </DataTable>
      </ListStates>
    </section>
  );
}

export function ModelDetailPage() {
  const modelId = Number(useParams().modelId);
  const model = useModel(modelId);
  const client = useQueryClient();
  const canWrite = useCanWrite();
  const navigate = useNavigate();
  const deleteModel = useDeleteModel();
  const [selected, setSelected] = useState<number | null>(null);
  const versionSelectId = useId();

  if (model.isPending) return <Loading />;
  if (model.isError) return <ErrorMessage error={model.error} />;

  const versions = [...(model.data.versions ?? (model.data.latest_version ? [model.data.latest_version] : []))].sort(
    (a, b) => b.number - a.number,
  );
  const version = versions.find((candidate) => candidate.id === selected) ?? versions[0] ?? null;

  return (
    <>
      <PageHeader
        title={model.data.name}
        subtitle={
          <>
            <Link to="/models">Models</Link> · {versions.length} version{versions.length === 1 ? '' : 's'}
          </>
        }
        actions={
          <button
            type="button"
            className="button button-danger"
            disabled={deleteModel.isPending}
            onClick={() => {
              if (window.confirm(`Delete ${model.data.name} and all its versions?`)) {
                deleteModel.mutate(modelId, { onSuccess: () => navigate('/models') });
              }
            }}
          >
            Delete model
          </button>
        }
      />
      <ErrorMessage error={deleteModel.error} />
      {versions.length > 1 ? (
        <div className="field field-inline">
          <label htmlFor={versionSelectId}>Version</label>
          <select
            id={versionSelectId}
            value={version?.id ?? ''}
            onChange={(event) => setSelected(Number(event.target.value))}
            data-testid="version-select"
          >
            {versions.map((candidate) => (
              <option key={candidate.id} value={candidate.id}>
                v{candidate.number} — {formatDate(candidate.created_at)}
              </option>
            ))}
          </select>
        </div>
      ) : null}
      {version ? (
        <VersionDetail modelId={modelId} version={version} />
      ) : (
        <EmptyState title="This model has no versions.">Upload a file below to create version 1.</EmptyState>
      )}
      <ModelDeployments modelId={modelId} />
      <section className="card" aria-labelledby="new-version-heading">
        <h2 id="new-version-heading">Upload a new version</h2>
        <UploadZone<ModelVersionCreated>
          disabled={!canWrite}
          label="ONNX model (.onnx or .zip) or PyTorch (.pt2, traced .pt)"
          accept={['.onnx', '.zip', '.pt2', '.pt']}
          testId="version-upload"
          buildRequest={(file) => {
            const form = new FormData();
            form.append('file', file);
            return { path: `models/${modelId}/versions/`, form };
          }}
          onUploaded={(created) => {
            setSelected(created?.id ?? null);
            void client.invalidateQueries({ queryKey: ['models'] });
          }}
          describeResult={(created) => (
            <>
              <span>Version {created?.number} is ready.</span>
              <IdenticalNotice identical={created?.identical_to} />
            </>
          )}
        />
      </section>
    </>
  );
}
