/** Start a deployment: model version, datasets, precisions, tolerance and target devices. */
import { useEffect, useId, useMemo, useState, type FormEvent, type ReactNode } from 'react';
import { Link, useNavigate, useSearchParams } from 'react-router';
import { rows, useAgents, useCanWrite, useCreateJob, useDatasets, useModel, useModels } from '../api/hooks';
import { METRICS, PRECISIONS, type Precision, type ToleranceMetric } from '../api/types';
import { ErrorMessage, PageHeader, StatusBadge } from '../components/common';
import { capabilitySummary } from '../components/capabilities';
import { formatRelative, formatShape } from '../format';
import {
  emptyDeploymentForm,
  NEEDS_CALIBRATION,
  toJobCreate,
  validateDeployment,
  type DeploymentField,
  type DeploymentForm,
} from './deploymentValidation';

const PRECISION_HELP: Record<Precision, string> = {
  fp32: 'Reference precision; the baseline for accuracy drops.',
  fp16: 'Half precision; fast on GPUs and CPUs with fp16 units.',
  int8: 'Static int8; needs a calibration dataset.',
  'int8-dynamic': 'Weights int8, activations quantized at run time; no calibration.',
  'int4-weight': 'Weights only, 4-bit; smallest download.',
};

const METRIC_HELP: Record<ToleranceMetric, string> = {
  auto: 'Task accuracy when the validation set has labels; otherwise top-1 agreement with FP32 for classifiers, else cosine similarity.',
  accuracy: 'Top-1 accuracy against labels (needs a labelled validation set).',
  cosine: 'Cosine similarity of outputs to the FP32 reference.',
  sqnr: 'Signal-to-quantization-noise ratio, in dB.',
  top1_agreement: 'Share of samples whose top-1 class matches FP32.',
};

function FieldError({ id, message }: { id: string; message?: string }) {
  if (!message) return null;
  return (
    <p id={id} className="field-error" role="alert">
      {message}
    </p>
  );
}

function Fieldset({ legend, children, hint }: { legend: string; children: ReactNode; hint?: ReactNode }) {
  return (
    <fieldset className="fieldset">
      <legend>{legend}</legend>
      {hint ? <p className="muted small">{hint}</p> : null}
      {children}
    </fieldset>
  );
}

export function NewDeploymentPage() {
  const [params] = useSearchParams();
  const navigate = useNavigate();
  const ids = {
    model: useId(),
    version: useId(),
    calibration: useId(),
    validation: useId(),
    metric: useId(),
    maxDrop: useId(),
    errors: useId(),
  };
  const [modelId, setModelId] = useState<number | null>(params.get('model') ? Number(params.get('model')) : null);
  const [form, setForm] = useState<DeploymentForm>(() => ({
    ...emptyDeploymentForm,
    modelVersion: params.get('version') ? Number(params.get('version')) : null,
  }));
  const [submitted, setSubmitted] = useState(false);

  const models = useModels('', 1, 500);
  const model = useModel(modelId ?? 0);
  const datasets = useDatasets(1, 500);
  const agents = useAgents();
  const createJob = useCreateJob();
  const canWrite = useCanWrite();

  const modelList = rows(models.data);
  const datasetList = rows(datasets.data);
  const agentList = rows(agents.data).filter((agent) => !agent.revoked);
  const versions = useMemo(
    () =>
      [...(model.data?.versions ?? (model.data?.latest_version ? [model.data.latest_version] : []))].sort(
        (a, b) => b.number - a.number,
      ),
    [model.data],
  );
  const version = versions.find((candidate) => candidate.id === form.modelVersion) ?? null;

  // A freshly chosen model starts on its newest version.
  useEffect(() => {
    if (modelId && versions.length > 0 && !versions.some((candidate) => candidate.id === form.modelVersion)) {
      setForm((previous) => ({ ...previous, modelVersion: versions[0].id }));
    }
  }, [modelId, versions, form.modelVersion]);

  const labelTargets = useMemo(() => {
    const selectors = new Set<string>();
    for (const agent of agentList) {
      for (const [key, value] of Object.entries(agent.labels ?? {})) selectors.add(`label=${key}=${value}`);
    }
    return [...selectors].sort();
  }, [agentList]);

  const result = validateDeployment(form, { version, datasets: datasetList, agents: agentList });
  const errors = submitted ? result.errors : {};
  const errorCount = Object.keys(result.errors).length;
  const set = <K extends keyof DeploymentForm>(key: K, value: DeploymentForm[K]) =>
    setForm((previous) => ({ ...previous, [key]: value }));
  const invalid = (field: DeploymentField) =>
    errors[field] ? { 'aria-invalid': true, 'aria-describedby': `${field}-error` } : {};

  const togglePrecision = (precision: Precision) =>
    set(
      'precisions',
      form.precisions.includes(precision)
        ? form.precisions.filter((item) => item !== precision)
        : [...form.precisions, precision],
    );
  const toggleTarget = (target: number | string) =>
    set('targets', form.targets.includes(target) ? form.targets.filter((item) => item !== target) : [...form.targets, target]);

  const submit = (event: FormEvent) => {
    event.preventDefault();
    setSubmitted(true);
    if (errorCount > 0) {
      document.getElementById(ids.errors)?.focus();
      return;
    }
    createJob.mutate(toJobCreate(form), { onSuccess: (job) => navigate(`/jobs/${job.id}`) });
  };

  const calibrationSets = datasetList.filter((dataset) => dataset.kind === 'calibration');
  const validationSets = datasetList.filter((dataset) => dataset.kind === 'validation');

  return (
    <>
      <PageHeader
        title="New deployment"
        subtitle="Kiln quantizes the model, builds each variant on your devices, and recommends the fastest one within your accuracy tolerance."
      />
      <form className="form deployment-form" onSubmit={submit} noValidate aria-label="New deployment">
        {submitted && errorCount > 0 ? (
          <div className="alert alert-error" role="alert" tabIndex={-1} id={ids.errors} data-testid="form-errors">
            <strong>Fix {errorCount === 1 ? 'this' : `these ${errorCount}`} before starting:</strong>
            <ul>
              {Object.entries(result.errors).map(([field, message]) => (
                <li key={field}>{message}</li>
              ))}
            </ul>
          </div>
        ) : null}

        <section className="card">
          <h2>Model</h2>
          {modelList.length === 0 && !models.isPending ? (
            <p className="muted">
              No models yet. <Link to="/models">Upload a model</Link> first.
            </p>
          ) : null}
          <div className="form-row">
            <div className="field">
              <label htmlFor={ids.model}>Model</label>
              <select
                id={ids.model}
                value={modelId ?? ''}
                data-testid="model-select"
                onChange={(event) => {
                  setModelId(event.target.value ? Number(event.target.value) : null);
                  set('modelVersion', null);
                }}
                {...invalid('modelVersion')}
              >
                <option value="">Choose a model…</option>
                {modelList.map((candidate) => (
                  <option key={candidate.id} value={candidate.id}>
                    {candidate.name}
                  </option>
                ))}
              </select>
            </div>
            <div className="field">
              <label htmlFor={ids.version}>Version</label>
              <select
                id={ids.version}
                value={form.modelVersion ?? ''}
                disabled={!modelId}
                data-testid="version-select"
                onChange={(event) => set('modelVersion', event.target.value ? Number(event.target.value) : null)}
                {...invalid('modelVersion')}
              >
                <option value="">{modelId ? 'Choose a version…' : 'Choose a model first'}</option>
                {versions.map((candidate) => (
                  <option key={candidate.id} value={candidate.id}>
                    v{candidate.number} ({candidate.filename})
                  </option>
                ))}
              </select>
            </div>
          </div>
          <FieldError id="modelVersion-error" message={errors.modelVersion} />
          {version ? (
            <p className="muted small">
              Inputs:{' '}
              {version.signature?.inputs?.map((input) => `${input.name} ${input.dtype} ${formatShape(input.shape)}`).join('; ') ||
                'unknown'}
            </p>
          ) : null}
        </section>

        <section className="card">
          <h2>Data</h2>
          {datasetList.length === 0 && !datasets.isPending ? (
            <p className="muted">
              No datasets yet. <Link to="/datasets">Upload calibration and validation data</Link> to enable int8 and
              measure accuracy.
            </p>
          ) : null}
          <div className="form-row">
            <div className="field">
              <label htmlFor={ids.calibration}>Calibration dataset</label>
              <select
                id={ids.calibration}
                value={form.calibrationDataset ?? ''}
                data-testid="calibration-select"
                onChange={(event) => set('calibrationDataset', event.target.value ? Number(event.target.value) : null)}
                {...invalid('calibrationDataset')}
              >
                <option value="">None</option>
                {calibrationSets.map((dataset) => (
                  <option key={dataset.id} value={dataset.id}>
                    {dataset.name} ({dataset.samples} samples)
                  </option>
                ))}
              </select>
              <FieldError id="calibrationDataset-error" message={errors.calibrationDataset} />
            </div>
            <div className="field">
              <label htmlFor={ids.validation}>Validation dataset</label>
              <select
                id={ids.validation}
                value={form.validationDataset ?? ''}
                data-testid="validation-select"
                onChange={(event) => set('validationDataset', event.target.value ? Number(event.target.value) : null)}
                {...invalid('validationDataset')}
              >
                <option value="">None</option>
                {validationSets.map((dataset) => (
                  <option key={dataset.id} value={dataset.id}>
                    {dataset.name} ({dataset.samples} samples{dataset.has_labels ? ', labelled' : ''})
                  </option>
                ))}
              </select>
              <FieldError id="validationDataset-error" message={errors.validationDataset} />
            </div>
          </div>
        </section>

        <section className="card">
          <Fieldset legend="Precisions">
            <div className="radio-row">
              <label className="choice">
                <input
                  type="radio"
                  name="precision-mode"
                  checked={form.precisionMode === 'auto'}
                  onChange={() => set('precisionMode', 'auto')}
                  data-testid="precision-auto"
                />
                Let Kiln choose (auto)
              </label>
              <label className="choice">
                <input
                  type="radio"
                  name="precision-mode"
                  checked={form.precisionMode === 'explicit'}
                  onChange={() => set('precisionMode', 'explicit')}
                  data-testid="precision-explicit"
                />
                Choose precisions
              </label>
            </div>
            {form.precisionMode === 'explicit' ? (
              <div className="checkbox-grid" {...invalid('precisions')}>
                {PRECISIONS.map((precision) => (
                  <label key={precision} className="choice choice-card">
                    <input
                      type="checkbox"
                      checked={form.precisions.includes(precision)}
                      onChange={() => togglePrecision(precision)}
                      data-testid={`precision-${precision}`}
                    />
                    <span>
                      <strong>{precision}</strong>
                      <span className="muted small block">
                        {PRECISION_HELP[precision]}
                        {NEEDS_CALIBRATION.includes(precision) && !form.calibrationDataset ? ' (choose a calibration dataset above)' : ''}
                      </span>
                    </span>
                  </label>
                ))}
              </div>
            ) : null}
            <FieldError id="precisions-error" message={errors.precisions} />
          </Fieldset>
        </section>

        <section className="card">
          <Fieldset legend="Accuracy tolerance" hint="A variant qualifies when its metric drops by at most this much against FP32.">
            <div className="form-row">
              <div className="field">
                <label htmlFor={ids.metric}>Metric</label>
                <select
                  id={ids.metric}
                  value={form.metric}
                  data-testid="metric-select"
                  onChange={(event) => set('metric', event.target.value as ToleranceMetric)}
                >
                  {METRICS.map((metric) => (
                    <option key={metric} value={metric}>
                      {metric}
                    </option>
                  ))}
                </select>
                <p className="muted small">{METRIC_HELP[form.metric]}</p>
              </div>
              <div className="field">
                <label htmlFor={ids.maxDrop}>{form.metric === 'sqnr' ? 'Minimum SQNR (dB)' : 'Maximum drop'}</label>
                <input
                  id={ids.maxDrop}
                  type="number"
                  inputMode="decimal"
                  step="any"
                  min={0}
                  value={form.maxDrop}
                  data-testid="max-drop-input"
                  onChange={(event) => set('maxDrop', event.target.value)}
                  {...invalid('maxDrop')}
                />
                <FieldError id="maxDrop-error" message={errors.maxDrop} />
              </div>
            </div>
          </Fieldset>
        </section>

        <section className="card">
          <Fieldset legend="Target devices" hint="Devices update live; an agent shows up here once it is registered and online.">
            <div className="radio-row">
              <label className="choice">
                <input
                  type="radio"
                  name="target-mode"
                  checked={form.targetMode === 'all'}
                  onChange={() => set('targetMode', 'all')}
                  data-testid="targets-all"
                />
                All online devices ({agentList.filter((agent) => agent.online).length} now)
              </label>
              <label className="choice">
                <input
                  type="radio"
                  name="target-mode"
                  checked={form.targetMode === 'selected'}
                  onChange={() => set('targetMode', 'selected')}
                  data-testid="targets-selected"
                />
                Choose devices or labels
              </label>
            </div>
            <ErrorMessage error={agents.error} />
            {agentList.length === 0 && !agents.isPending ? (
              <p className="muted">
                No devices registered. <Link to="/devices">Register a device agent</Link> to run benchmarks on your
                hardware.
              </p>
            ) : (
              <ul className="device-choices" aria-label="Devices" data-testid="device-choices">
                {agentList.map((agent) => (
                  <li key={agent.id}>
                    <label className="choice choice-card">
                      <input
                        type="checkbox"
                        disabled={form.targetMode !== 'selected'}
                        checked={form.targetMode === 'selected' && form.targets.includes(agent.id)}
                        onChange={() => toggleTarget(agent.id)}
                        data-testid={`target-agent-${agent.id}`}
                      />
                      <span>
                        <strong>{agent.name}</strong>{' '}
                        <StatusBadge status={agent.online ? 'online' : 'offline'} />
                        <span className="muted small block">{capabilitySummary(agent.capabilities) || 'No capabilities reported'}</span>
                        <span className="labels">
                          {Object.entries(agent.labels ?? {}).map(([key, value]) => (
                            <span className="chip" key={key}>
                              {key}={value}
                            </span>
                          ))}
                        </span>
                        <span className="muted small block">Last heartbeat {formatRelative(agent.last_heartbeat_at)}</span>
                      </span>
                    </label>
                  </li>
                ))}
              </ul>
            )}
            {labelTargets.length > 0 ? (
              <div className="label-targets">
                <p className="small">Or every device with a label:</p>
                {labelTargets.map((selector) => (
                  <label key={selector} className="choice">
                    <input
                      type="checkbox"
                      disabled={form.targetMode !== 'selected'}
                      checked={form.targetMode === 'selected' && form.targets.includes(selector)}
                      onChange={() => toggleTarget(selector)}
                    />
                    <code>{selector.replace(/^label=/, '')}</code>
                  </label>
                ))}
              </div>
            ) : null}
            <FieldError id="targets-error" message={errors.targets} />
          </Fieldset>
        </section>

        {result.warnings.length > 0 ? (
          <div className="alert alert-warn" data-testid="form-warnings">
            <ul>
              {result.warnings.map((warning) => (
                <li key={warning}>{warning}</li>
              ))}
            </ul>
          </div>
        ) : null}
        <ErrorMessage error={createJob.error} title="The server did not start the deployment:" />
        <div className="button-row">
          <button type="submit" className="button button-primary" disabled={createJob.isPending || !canWrite} data-testid="start-deployment">
            {createJob.isPending ? 'Starting…' : 'Start deployment'}
          </button>
          <Link to="/deployments" className="button button-ghost">
            Cancel
          </Link>
        </div>
      </form>
    </>
  );
}
