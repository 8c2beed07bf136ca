/** Start a deployment: model version, datasets, precisions, tolerance and target devices. */
import { useEffect, useId, useMemo, useState, type FormEvent, type ReactNode } from 'react';
import { Link, useNavigate, useSearchParams } from 'react-router';
import { DatasetFeedsFields, emptyFeedsForm, feedsToJob, type FeedsForm } from '../components/DatasetFeedsFields';
import { rows, useAgents, useCanWrite, useCreateJob, useDatasets, useModel, useModels } from '../api/hooks';
import {
  DECLARED_METRIC_KINDS,
  METRICS,
  PRECISIONS,
  type Agent,
  type Dataset,
  type DeclaredMetricKind,
  type ModelVersion,
  type Precision,
  type ToleranceMetric,
} from '../api/types';
import { autoFigures, declaredOptions, KIND_LABELS, kindLabel, type JudgedOutput } from '../components/outputKinds';
import { ErrorMessage, PageHeader, StatusBadge } from '../components/common';
import { NameOptions, SelectField, TextField } from '../components/FormFields';
import { capabilitySummary } from '../components/capabilities';
import { formatRelative, formatShape } from '../format';
import { dropMeaning, figureName, parsePercent, percentWarning } from '../components/tolerance';
import {
  DEFAULT_DROP_PERCENT,
  DEFAULT_SQNR_DB,
  MAX_BUDGET_MINUTES,
  emptyDeploymentForm,
  NEEDS_CALIBRATION,
  toJobCreate,
  validateDeployment,
  type DeploymentField,
  type DeploymentForm,
  type MetricDraft,
} from './deploymentValidation';
import { splitByCompatibility } from './datasetCompatibility';

const PRECISION_HELP: Record<Precision, string> = {
  fp32: 'Reference precision; the baseline for accuracy drops.',
  bf16: "FP32's weights computed in bfloat16 by OpenVINO, on CPUs with bf16 units (AVX512-BF16, AMX).",
  fp16: 'Half precision; fast on GPUs and CPUs with fp16 units.',
  int8: 'Static int8; needs a calibration dataset.',
  'int8-dynamic': 'Weights int8, activations quantized at run time; no calibration.',
  'int4-weight': 'Weights only, 4-bit; smallest download.',
};

const METRIC_HELP: Record<ToleranceMetric, string> = {
  auto: "Each primary output by its kind's metric (top-1 agreement, mask IoU, detection F1, cosine, relative L2); task accuracy when the validation set has labels.",
  accuracy: 'Top-1 accuracy against labels (needs a labelled validation set).',
  cosine: 'Cosine similarity of outputs to the FP32 reference.',
  sqnr: 'Signal-to-quantization-noise ratio, in dB.',
  top1_agreement: 'Share of positions whose top-1 class matches FP32 (ties in FP32 not counted).',
  mask_iou: 'IoU of the thresholded foreground with FP32’s (probability maps).',
  relative_l2: 'Relative L2 error against FP32 (dense maps, regression).',
  detection_f1: 'F1 of detections matched to FP32’s at IoU 0.5.',
  mean_iou: 'Mean IoU against label masks (needs labels).',
  sequence_accuracy: 'Share of CTC-decoded sequences equal to the labels (declare a ctc metric with its blank).',
  cer: 'Character error rate of CTC-decoded sequences against the labels.',
};

const DECLARED_HELP: Record<DeclaredMetricKind, string> = {
  top1_agreement: 'top-1 agreement with FP32',
  top5_agreement: 'top-5 agreement with FP32',
  id_agreement: 'equal ids',
  mask_iou: 'mask IoU at a threshold',
  relative_l2: 'relative L2 error',
  sqnr: 'SQNR in dB',
  cosine: 'cosine per vector',
  sentence_cosine: 'cosine of mean-pooled sentence vectors',
  neighbours: 'nearest-neighbour agreement of embeddings',
  regions: 'regions found vs FP32 (region F1 at a threshold)',
  peak: 'peak position agreement',
  decoded: 'value decoded around the peak (bins)',
  detection: 'detections vs FP32 (score threshold)',
  accuracy: 'top-1 accuracy vs labels',
  top5_accuracy: 'top-5 accuracy vs labels',
  mean_iou: 'mean IoU vs label masks',
  ctc: 'sequence accuracy and CER vs labels (CTC)',
  plugin: 'your plugin (entry point kiln.metrics, on the agent)',
};

type DatasetSplit = ReturnType<typeof splitByCompatibility>;

function datasetLabel(dataset: Dataset): string {
  const samples = dataset.samples > 0 ? `${dataset.samples} samples` : 'no readable samples';
  return `${dataset.name} (${samples}${dataset.has_labels ? ', labelled' : ''})`;
}

/** The datasets that fit the chosen model first; those that do not in their own group, marked. */
function DatasetOptions({ split, version }: { split: DatasetSplit; version: ModelVersion | null }) {
  if (!version) {
    return (
      <>
        {[...split.fitting, ...split.misfits].map(({ dataset }) => (
          <option key={dataset.id} value={dataset.id}>{datasetLabel(dataset)}</option>
        ))}
      </>
    );
  }
  return (
    <>
      {split.fitting.length > 0 ? (
        <optgroup label="Fit this model">
          {split.fitting.map(({ dataset }) => (
            <option key={dataset.id} value={dataset.id} data-fits="true">✓ {datasetLabel(dataset)}</option>
          ))}
        </optgroup>
      ) : null}
      {split.misfits.length > 0 ? (
        <optgroup label="Do not fit this model">
          {split.misfits.map(({ dataset }) => (
            <option key={dataset.id} value={dataset.id} data-fits="false">✗ {datasetLabel(dataset)}</option>
          ))}
        </optgroup>
      ) : null}
    </>
  );
}

function CompatibilityNote({ split, version, chosenForYou, testId }: { split: DatasetSplit; version: ModelVersion | null; chosenForYou?: boolean; testId: string }) {
  const total = split.fitting.length + split.misfits.length;
  if (!version || total === 0) return null;
  return (
    <p className="muted small" data-testid={testId}>
      {split.fitting.length} of {total} fit {version.signature?.inputs?.map((input) => `${input.name} ${formatShape(input.shape)}`).join(', ') || 'this model'}
      {chosenForYou ? ': the only one that fits, chosen for you.' : '.'}
    </p>
  );
}

/** The calibration or validation dataset, fitting ones first, with how many fit and why the choice is refused. */
const DATASET_KINDS = ['calibration', 'validation'] as const;
type DatasetRole = (typeof DATASET_KINDS)[number];

function datasetField(kind: DatasetRole): 'calibrationDataset' | 'validationDataset' {
  return `${kind}Dataset`;
}

function DatasetField({
  kind,
  split,
  version,
  value,
  onChange,
  chosenForYou,
  error,
  ...invalidProps
}: {
  kind: DatasetRole;
  split: DatasetSplit;
  version: ModelVersion | null;
  value: number | null;
  onChange: (dataset: number | null) => void;
  /** Chosen by the form: the only dataset of this kind that fits the model. */
  chosenForYou?: boolean;
  error?: string;
  'aria-invalid'?: boolean;
  'aria-describedby'?: string;
}) {
  return (
    <SelectField
      label={kind === 'calibration' ? 'Calibration dataset' : 'Validation dataset'}
      value={value ?? ''}
      data-testid={`${kind}-select`}
      onChange={(event) => onChange(event.target.value ? Number(event.target.value) : null)}
      {...invalidProps}
      after={
        <>
          <CompatibilityNote split={split} version={version} chosenForYou={chosenForYou} testId={`${kind}-compatibility`} />
          <FieldError id={`${datasetField(kind)}-error`} message={error} />
        </>
      }
    >
      <option value="">None</option>
      <DatasetOptions split={split} version={version} />
    </SelectField>
  );
}

/** Metrics declared per output: which outputs the tolerance reads, with what threshold. */
function DeclaredMetrics({
  version,
  metrics,
  onChange,
  error,
}: {
  version: ModelVersion | null;
  metrics: MetricDraft[];
  onChange: (metrics: MetricDraft[]) => void;
  error?: string;
}) {
  const outputs = version?.signature?.outputs ?? [];
  const kinds = version?.output_kinds ?? {};
  const update = (index: number, change: Partial<MetricDraft>) =>
    onChange(metrics.map((metric, position) => (position === index ? { ...metric, ...change } : metric)));
  return (
    <Fieldset
      legend="Metrics per output (optional)"
      hint="Without any, the first output is judged by its kind's metric. Declare metrics to choose the primary outputs the tolerance reads, set thresholds, or score against labels; the report shows them all."
    >
      {outputs.length > 0 ? (
        <ul className="muted small" data-testid="output-kind-summary">
          {outputs.map((output) => (
            <li key={output.name}>
              <code>{output.name}</code>: {kindLabel(kinds[output.name]?.kind)}
              {kinds[output.name]?.kind ? ` — ${KIND_LABELS[kinds[output.name].kind as keyof typeof KIND_LABELS]?.metric ?? ''}` : ''}
            </li>
          ))}
        </ul>
      ) : null}
      {metrics.map((metric, index) => (
        <div className="form-row" key={index} data-testid="declared-metric">
          <SelectField label="Output" value={metric.output} onChange={(event) => update(index, { output: event.target.value })}>
            <NameOptions items={outputs} />
          </SelectField>
          <SelectField
            label="Metric kind"
            value={metric.kind}
            onChange={(event) => update(index, { kind: event.target.value as DeclaredMetricKind })}
          >
            {DECLARED_METRIC_KINDS.map((kind) => (
              <option key={kind} value={kind}>
                {kind} — {DECLARED_HELP[kind]}
              </option>
            ))}
          </SelectField>
          {declaredOptions(metric.kind).includes('threshold') ? (
            <TextField
              label="Threshold"
              type="number"
              step="any"
              placeholder={metric.kind === 'detection' ? '0.25' : '0.5'}
              value={metric.threshold}
              onChange={(event) => update(index, { threshold: event.target.value })}
            />
          ) : null}
          {declaredOptions(metric.kind).includes('blank') ? (
            <TextField
              label="Blank index"
              type="number"
              min={0}
              step={1}
              value={metric.blank}
              onChange={(event) => update(index, { blank: event.target.value })}
            />
          ) : null}
          {declaredOptions(metric.kind).includes('plugin') ? (
            <TextField label="Entry point" value={metric.plugin} onChange={(event) => update(index, { plugin: event.target.value })} />
          ) : null}
          <label className="choice">
            <input type="checkbox" checked={metric.primary} onChange={(event) => update(index, { primary: event.target.checked })} />
            Primary
          </label>
          <button type="button" className="button button-small" onClick={() => onChange(metrics.filter((_, position) => position !== index))}>
            Remove
          </button>
        </div>
      ))}
      <button
        type="button"
        className="button button-small"
        disabled={outputs.length === 0}
        data-testid="add-metric"
        onClick={() =>
          onChange([
            ...metrics,
            { output: outputs[0]?.name ?? '', kind: 'top1_agreement', primary: metrics.length === 0, threshold: '', blank: '0', plugin: '' },
          ])
        }
      >
        Add a metric
      </button>
      <FieldError id="metrics-error" message={error} />
    </Fieldset>
  );
}

function FieldError({ id, message }: { id: string; message?: string }) {
  if (!message) return null;
  return (
    <p id={id} className="field-error" role="alert">
      {message}
    </p>
  );
}

/** The allowed drop in percent, with the metric's unit named and the fraction it becomes; a dB floor for sqnr. */
function ToleranceField({ id, metric, figures, value, error, onChange, invalidProps }: {
  id: string; metric: ToleranceMetric; figures: string[] | null; value: string; error?: string; onChange: (value: string) => void; invalidProps: object;
}) {
  const sqnr = metric === 'sqnr';
  const percent = parsePercent(value);
  const warning = sqnr || error ? null : percentWarning(value);
  return (
    <div className="field">
      <label htmlFor={id}>{sqnr ? 'Minimum SQNR' : 'Maximum drop'}</label>
      <div className="input-with-unit">
        <input
          id={id}
          type="text"
          inputMode="decimal"
          autoComplete="off"
          value={value}
          data-testid="max-drop-input"
          onChange={(event) => onChange(event.target.value)}
          {...invalidProps}
        />
        <span className="input-unit" aria-hidden="true">{sqnr ? 'dB' : '%'}</span>
      </div>
      <p className="muted small" data-testid="max-drop-meaning">
        {sqnr
          ? 'Every variant must keep at least this SQNR against FP32, in decibels (30 dB keeps the noise at about 3% of the signal).'
          : percent !== null && !error
            ? dropMeaning(percent, metric, figures)
            : 'In percent: 1 means a drop of 1 point on a 0–100% score.'}
      </p>
      {warning ? <p className="field-warning small" data-testid="max-drop-warning">{warning}</p> : null}
      <FieldError id="maxDrop-error" message={error} />
    </div>
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

/** CPU flags of bf16 units OpenVINO's bf16 inference precision runs on (workers/quantize/isa_families.py X86_BF16). */
const BF16_FLAGS = ['avx512_bf16', 'amx_bf16'];

/** Whether any device could run a bf16 variant: OpenVINO on a CPU with bf16 units (elsewhere it is not built). */
export function bf16Available(agents: Agent[]): boolean {
  return agents.some((agent) => !!agent.capabilities?.runtimes?.openvino && (agent.capabilities?.isa ?? []).some((flag) => BF16_FLAGS.includes(flag)));
}

/** The model's outputs as the tolerance will judge them: the declared primaries, else the first output. */
export function judgedOutputs(version: ModelVersion, metrics: MetricDraft[]): JudgedOutput[] {
  const outputs = version.signature?.outputs ?? [];
  const declaredPrimaries = new Set(metrics.filter((metric) => metric.primary).map((metric) => metric.output));
  return outputs.map((output, index) => ({
    name: output.name,
    kind: version.output_kinds?.[output.name]?.kind,
    primary: declaredPrimaries.size ? declaredPrimaries.has(output.name) : index === 0,
    declared: metrics.filter((metric) => metric.output === output.name).map((metric) => ({ kind: metric.kind, primary: metric.primary })),
  }));
}

/** What "auto" will judge for this model and validation set, in words. */
export function autoMetricText(outputs: JudgedOutput[], figures: string[] | null, validation: Dataset | null): string {
  const primaries = outputs.filter((output) => output.primary);
  if (primaries.length === 0) return METRIC_HELP.auto;
  const where = `output${primaries.length === 1 ? '' : 's'} ${primaries.map((output) => `“${output.name}”`).join(', ')}`;
  if (figures === null) {
    return `The ${where} by ${primaries.length === 1 ? 'its' : 'their'} kind's metric: Kiln infers the kind when the job runs (set it on the model's page to know now). ${METRIC_HELP.auto}`;
  }
  const data = validation ? `“${validation.name}”${validation.has_labels ? ' (labelled)' : ' (no labels)'}` : 'no validation dataset';
  const labelled = figures.some((figure) => figure.endsWith('_accuracy') || figure === 'mean_iou');
  const hint = labelled
    ? ' against its labels.'
    : primaries.some((output) => output.kind === 'class_scores' || output.kind === 'probability_map') && !validation?.has_labels
      ? ' against FP32; with a labelled validation set, task accuracy against the labels instead.'
      : ' against FP32.';
  return `For this model and ${data}: ${figures.map(figureName).join(' and ')} of ${where}${hint}`;
}

export function NewDeploymentPage() {
  const [params] = useSearchParams();
  const navigate = useNavigate();
  const ids = {
    model: useId(),
    version: useId(),
    metric: useId(),
    maxDrop: useId(),
    budget: useId(),
    errors: useId(),
  };
  const [modelId, setModelId] = useState<number | null>(params.get('model') ? Number(params.get('model')) : null);
  const [form, setForm] = useState<DeploymentForm>(() => ({
    ...emptyDeploymentForm,
    modelVersion: params.get('version') ? Number(params.get('version')) : null,
  }));
  const [submitted, setSubmitted] = useState(false);
  // A dataset slot the user has set (even to None) is theirs; an untouched one takes the only dataset that fits.
  const [touched, setTouched] = useState<Record<DatasetRole, boolean>>({ calibration: false, validation: false });
  const [autoChosen, setAutoChosen] = useState<Record<DatasetRole, number | null>>({ calibration: null, validation: null });
  const [feeds, setFeeds] = useState<FeedsForm>(emptyFeedsForm);

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
  // A dataset is checked against the model as soon as it is chosen, and the tolerance as it is typed, next to
  // their fields; the rest on submit.
  const errors = submitted
    ? result.errors
    : {
        calibrationDataset: form.calibrationDataset ? result.errors.calibrationDataset : undefined,
        validationDataset: form.validationDataset ? result.errors.validationDataset : undefined,
        maxDrop: result.errors.maxDrop,
        budget: result.errors.budget,
      };
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
    const fed = feedsToJob(feeds);
    if (errorCount > 0 || fed.problems.length > 0) {
      document.getElementById(ids.errors)?.focus();
      return;
    }
    createJob.mutate({ ...toJobCreate(form), ...fed.fields }, { onSuccess: (job) => navigate(`/jobs/${job.id}`) });
  };

  const calibrationSets = splitByCompatibility(datasetList.filter((dataset) => dataset.kind === 'calibration'), version);
  const validationSets = splitByCompatibility(datasetList.filter((dataset) => dataset.kind === 'validation'), version);
  const onlyFit: Record<DatasetRole, number | null> = {
    calibration: version && calibrationSets.fitting.length === 1 ? calibrationSets.fitting[0].dataset.id : null,
    validation: version && validationSets.fitting.length === 1 ? validationSets.fitting[0].dataset.id : null,
  };

  // Exactly one dataset fits a slot the user has not set: choose it (and let it go again if the model changes).
  useEffect(() => {
    for (const kind of DATASET_KINDS) {
      if (touched[kind]) continue;
      const current = form[datasetField(kind)];
      const pick = onlyFit[kind];
      if (pick !== null && current !== pick && (current === null || current === autoChosen[kind])) {
        setForm((previous) => ({ ...previous, [datasetField(kind)]: pick }));
        setAutoChosen((previous) => ({ ...previous, [kind]: pick }));
      } else if (pick === null && current !== null && current === autoChosen[kind]) {
        setForm((previous) => ({ ...previous, [datasetField(kind)]: null }));
        setAutoChosen((previous) => ({ ...previous, [kind]: null }));
      }
    }
  }, [onlyFit.calibration, onlyFit.validation, touched, form, autoChosen]);

  const validationChoice = datasetList.find((dataset) => dataset.id === form.validationDataset) ?? null;
  const judged = version ? judgedOutputs(version, form.metrics) : [];
  const figures = version ? autoFigures(judged, !!validationChoice?.has_labels) : null;

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
            {DATASET_KINDS.map((kind) => (
              <DatasetField
                key={kind}
                kind={kind}
                split={kind === 'calibration' ? calibrationSets : validationSets}
                version={version}
                value={form[datasetField(kind)]}
                onChange={(dataset) => {
                  setTouched((previous) => ({ ...previous, [kind]: true }));
                  set(datasetField(kind), dataset);
                }}
                chosenForYou={!touched[kind] && form[datasetField(kind)] !== null && form[datasetField(kind)] === autoChosen[kind]}
                error={errors[datasetField(kind)]}
                {...invalid(datasetField(kind))}
              />
            ))}
          </div>
          <DatasetFeedsFields version={version} value={feeds} onChange={setFeeds} hasCalibration={form.calibrationDataset !== null} />
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
            {form.precisionMode === 'auto' ? (
              <div className="field budget-field">
                <label htmlFor={ids.budget}>Search budget</label>
                <div className="input-with-unit">
                  <input
                    id={ids.budget}
                    type="text"
                    inputMode="numeric"
                    autoComplete="off"
                    value={form.budgetMinutes}
                    onChange={(event) => set('budgetMinutes', event.target.value)}
                    data-testid="budget-input"
                    {...invalid('budget')}
                  />
                  <span className="input-unit" aria-hidden="true">min</span>
                </div>
                <p className="muted small">
                  How long the search may go on before it reports the best it has found: whole minutes, 1 to {MAX_BUDGET_MINUTES}.
                </p>
                <FieldError id="budget-error" message={errors.budget} />
              </div>
            ) : null}
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
                        {precision === 'bf16' && !bf16Available(agentList) ? ' None of your devices runs OpenVINO on bf16 units: it would not be built.' : ''}
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
                  onChange={(event) => {
                    const metric = event.target.value as ToleranceMetric;
                    // A dB floor and a percentage are different numbers: switching resets the field to the other's default.
                    if ((metric === 'sqnr') !== (form.metric === 'sqnr')) set('maxDrop', metric === 'sqnr' ? DEFAULT_SQNR_DB : DEFAULT_DROP_PERCENT);
                    set('metric', metric);
                  }}
                >
                  {METRICS.map((metric) => (
                    <option key={metric} value={metric}>
                      {metric}
                    </option>
                  ))}
                </select>
                <p className="muted small" data-testid="metric-help">
                  {form.metric === 'auto' ? autoMetricText(judged, figures, validationChoice) : METRIC_HELP[form.metric]}
                </p>
              </div>
              <ToleranceField
                id={ids.maxDrop}
                metric={form.metric}
                figures={figures}
                value={form.maxDrop}
                error={errors.maxDrop}
                onChange={(value) => set('maxDrop', value)}
                invalidProps={invalid('maxDrop')}
              />
            </div>
          </Fieldset>
        </section>

        <section className="card">
          <DeclaredMetrics version={version} metrics={form.metrics} onChange={(metrics) => set('metrics', metrics)} error={errors.metrics} />
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
