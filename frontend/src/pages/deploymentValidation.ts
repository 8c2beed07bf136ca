/** Client-side checks for a new deployment, run before anything is sent to the server. */
import type { Agent, Dataset, DeclaredMetric, DeclaredMetricKind, JobCreate, ModelVersion, Precision, ToleranceMetric } from '../api/types';
import { parsePercent, percentProblem, percentToFraction } from '../components/tolerance';
import { datasetCompatibility, mismatchMessage } from './datasetCompatibility';

/** One declared metric as typed in the form (numbers still text). */
export interface MetricDraft {
  output: string;
  kind: DeclaredMetricKind;
  primary: boolean;
  threshold: string;
  blank: string;
  plugin: string;
}

/** Declared metric kinds that read the validation set's labels. */
export const LABEL_METRIC_KINDS: DeclaredMetricKind[] = ['accuracy', 'top5_accuracy', 'mean_iou', 'ctc'];
const LABEL_TOLERANCES: ToleranceMetric[] = ['accuracy', 'mean_iou', 'sequence_accuracy', 'cer'];
const PLUGIN_NAME = /^[A-Za-z0-9_.-]{1,100}$/;

export interface DeploymentForm {
  modelVersion: number | null;
  calibrationDataset: number | null;
  validationDataset: number | null;
  precisionMode: 'auto' | 'explicit';
  precisions: Precision[];
  /** The auto search's time budget in minutes, as typed. */
  budgetMinutes: string;
  metric: ToleranceMetric;
  /** The allowed drop in percent as typed ("1" or "1%"); for sqnr, the floor in dB. */
  maxDrop: string;
  targetMode: 'all' | 'selected';
  /** Agent ids and "label=key=value" selectors. */
  targets: (number | string)[];
  /** Metrics declared per output; the tolerance applies to the primary ones. */
  metrics: MetricDraft[];
}

export type DeploymentField =
  | 'modelVersion'
  | 'calibrationDataset'
  | 'validationDataset'
  | 'precisions'
  | 'budget'
  | 'maxDrop'
  | 'metric'
  | 'targets'
  | 'metrics';

export interface DeploymentContext {
  version?: ModelVersion | null;
  datasets: Dataset[];
  agents: Agent[];
}

export interface ValidationResult {
  errors: Partial<Record<DeploymentField, string>>;
  warnings: string[];
}

/** Precisions that need a calibration dataset (static activation quantization). */
export const NEEDS_CALIBRATION: Precision[] = ['int8'];
/** The SQNR floor a new form starts from when its metric is switched to sqnr (dB), and the drop for the rest (%). */
export const DEFAULT_SQNR_DB = '30';
export const DEFAULT_DROP_PERCENT = '1';
/** The auto search's budget a new form starts from, and the most it takes (platform/kiln/pipeline/specs.py). */
export const DEFAULT_BUDGET_MINUTES = '10';
export const MAX_BUDGET_MINUTES = 24 * 60;

export const emptyDeploymentForm: DeploymentForm = {
  modelVersion: null,
  calibrationDataset: null,
  validationDataset: null,
  precisionMode: 'auto',
  precisions: [],
  budgetMinutes: DEFAULT_BUDGET_MINUTES,
  metric: 'auto',
  maxDrop: DEFAULT_DROP_PERCENT,
  targetMode: 'all',
  targets: [],
  metrics: [],
};

/** The first problem with the declared metrics, or null. */
export function metricsProblem(metrics: MetricDraft[], version: ModelVersion | null | undefined, labelled: boolean): string | null {
  const outputs = (version?.signature?.outputs ?? []).map((output) => output.name);
  const seen = new Set<string>();
  for (const [index, metric] of metrics.entries()) {
    const where = `Metric ${index + 1}`;
    if (!outputs.includes(metric.output)) return `${where}: choose one of the model's outputs.`;
    const key = `${metric.output}/${metric.kind}/${metric.plugin}`;
    if (seen.has(key)) return `${where}: ${metric.kind} is already declared for ${metric.output}.`;
    seen.add(key);
    if (metric.threshold.trim() !== '') {
      const threshold = Number(metric.threshold);
      if (!Number.isFinite(threshold) || threshold <= 0 || threshold >= 1) return `${where}: the threshold is a number strictly between 0 and 1.`;
    }
    if (metric.kind === 'ctc' && !/^\d+$/.test(metric.blank.trim())) return `${where}: CTC needs the blank index (an integer, often 0).`;
    if (metric.kind === 'plugin' && !PLUGIN_NAME.test(metric.plugin.trim())) {
      return `${where}: name the plugin's entry point (group kiln.metrics).`;
    }
    if (LABEL_METRIC_KINDS.includes(metric.kind) && !labelled) return `${where}: ${metric.kind} needs a validation dataset with labels.`;
  }
  return null;
}

export function toDeclaredMetric(draft: MetricDraft): DeclaredMetric {
  const metric: DeclaredMetric = { output: draft.output, kind: draft.kind, primary: draft.primary };
  if (['mask_iou', 'mean_iou', 'detection'].includes(draft.kind) && draft.threshold.trim() !== '') metric.threshold = Number(draft.threshold);
  if (draft.kind === 'ctc') metric.blank = Number(draft.blank);
  if (draft.kind === 'plugin') metric.plugin = draft.plugin.trim();
  return metric;
}


export function validateDeployment(form: DeploymentForm, context: DeploymentContext): ValidationResult {
  const errors: ValidationResult['errors'] = {};
  const warnings: string[] = [];
  const byId = (id: number | null) => context.datasets.find((dataset) => dataset.id === id) ?? null;
  const calibration = byId(form.calibrationDataset);
  const validation = byId(form.validationDataset);

  if (!form.modelVersion) errors.modelVersion = 'Choose a model and a version to deploy.';

  if (form.precisionMode === 'explicit') {
    if (form.precisions.length === 0) {
      errors.precisions = 'Choose at least one precision, or let Kiln choose (auto).';
    } else {
      const needing = form.precisions.filter((precision) => NEEDS_CALIBRATION.includes(precision));
      if (needing.length > 0 && !form.calibrationDataset) {
        errors.calibrationDataset = `${needing.join(', ')} needs a calibration dataset. Choose one, or pick int8-dynamic, which needs none.`;
      }
    }
  } else {
    const budgetError = budgetProblem(form.budgetMinutes);
    if (budgetError) errors.budget = budgetError;
    if (!form.calibrationDataset) warnings.push('Without a calibration dataset, auto skips static int8 quantization.');
  }

  if (calibration && calibration.kind !== 'calibration') {
    errors.calibrationDataset = `“${calibration.name}” is a ${calibration.kind} dataset, not a calibration dataset.`;
  } else if (calibration && context.version) {
    const mismatch = mismatchMessage(calibration, datasetCompatibility(calibration, context.version));
    if (mismatch) errors.calibrationDataset = mismatch;
  }

  if (validation && validation.kind !== 'validation') {
    errors.validationDataset = `“${validation.name}” is a ${validation.kind} dataset, not a validation dataset.`;
  } else if (validation && context.version) {
    const mismatch = mismatchMessage(validation, datasetCompatibility(validation, context.version));
    if (mismatch) errors.validationDataset = mismatch;
  }
  if (LABEL_TOLERANCES.includes(form.metric) && !errors.validationDataset) {
    if (!validation) errors.validationDataset = `The ${form.metric} metric needs a validation dataset with labels.`;
    else if (!validation.has_labels) errors.validationDataset = `“${validation.name}” has no labels, which the ${form.metric} metric needs.`;
  }
  const metricsError = metricsProblem(form.metrics, context.version, !!validation?.has_labels);
  if (metricsError) errors.metrics = metricsError;
  if (!form.validationDataset && !errors.validationDataset) {
    warnings.push('Without a validation dataset, accuracy is measured on calibration or synthetic inputs only.');
  }
  if (calibration && validation && sameFiles(calibration, validation)) {
    warnings.push(
      `“${calibration.name}” and “${validation.name}” are the same files: int8 is tuned on the data its accuracy is then measured on, so the accuracy reads better than it will be on new data. Validate on files kept apart.`,
    );
  }

  const toleranceError = toleranceProblem(form.metric, form.maxDrop);
  if (toleranceError) errors.maxDrop = toleranceError;

  const online = context.agents.filter((agent) => agent.online && !agent.revoked);
  if (form.targetMode === 'selected') {
    if (form.targets.length === 0) {
      errors.targets = 'Choose at least one device, or deploy to all online devices.';
    } else {
      const offline = context.agents.filter(
        (agent) => form.targets.includes(agent.id) && (!agent.online || agent.revoked),
      );
      if (offline.length > 0) {
        warnings.push(`${offline.map((agent) => agent.name).join(', ')} ${offline.length === 1 ? 'is' : 'are'} offline; the job waits for ${offline.length === 1 ? 'it' : 'them'}.`);
      }
    }
  } else if (online.length === 0) {
    warnings.push('No device is online right now. The job will wait until an agent connects.');
  }

  return { errors, warnings };
}

/** Two datasets made from the same uploaded bytes (the same zip, folder or .npz), whatever their kind or name. */
export function sameFiles(a: Dataset, b: Dataset): boolean {
  return (a.source_sha256 ?? a.sha256) === (b.source_sha256 ?? b.sha256);
}

/** The budget field's problem, or null: whole minutes from 1 to a day. */
export function budgetProblem(text: string): string | null {
  const value = Number(text.trim());
  if (text.trim() === '' || !Number.isInteger(value) || value < 1 || value > MAX_BUDGET_MINUTES) {
    return `The search budget is a whole number of minutes from 1 to ${MAX_BUDGET_MINUTES}, e.g. ${DEFAULT_BUDGET_MINUTES}.`;
  }
  return null;
}

/** The tolerance field's problem, or null: a floor in dB for sqnr, a percentage from 0 to 100 for every other metric. */
export function toleranceProblem(metric: ToleranceMetric, text: string): string | null {
  if (metric !== 'sqnr') return percentProblem(text);
  const floor = text.trim() === '' ? Number.NaN : Number(text.trim().replace(/\s*db$/i, ''));
  return Number.isFinite(floor) ? null : 'Enter the lowest SQNR a variant may have, in dB, e.g. 30.';
}

export function toJobCreate(form: DeploymentForm): JobCreate {
  return {
    model_version: form.modelVersion as number,
    precisions: form.precisionMode === 'auto' ? ['auto'] : [...form.precisions],
    calibration_dataset: form.calibrationDataset,
    validation_dataset: form.validationDataset,
    targets: form.targetMode === 'all' ? [] : [...form.targets],
    // SQNR has no FP32 value to drop from (it is infinite there): the field is a floor in dB.
    tolerance:
      form.metric === 'sqnr'
        ? { metric: 'sqnr', min_value: Number(form.maxDrop.trim().replace(/\s*db$/i, '')) }
        : { metric: form.metric, max_drop: percentToFraction(parsePercent(form.maxDrop) ?? Number.NaN) },
    metrics: form.metrics.map(toDeclaredMetric),
    ...(form.precisionMode === 'auto' ? { budget_minutes: Number(form.budgetMinutes.trim()) } : {}),
  };
}
