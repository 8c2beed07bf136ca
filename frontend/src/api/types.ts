/** Wire shapes from docs/api.md. Fields the contract does not promise are optional. */

export type Role = 'owner' | 'member' | 'viewer';

export interface Organization {
  id: number;
  name: string;
  slug: string;
  role: Role;
}

export interface Me {
  user: { id: number; username: string };
  organization: Organization | null;
  organizations: Organization[];
}

/** A user's membership in the current organization (`GET members/`). */
export interface Member {
  id: number;
  user: number;
  username: string;
  role: Role;
  created_at: string;
}

export const ROLES: Role[] = ['owner', 'member', 'viewer'];

export interface Paginated<T> {
  count: number;
  next: string | null;
  previous: string | null;
  results: T[];
}

export interface ApiToken {
  id: number;
  name: string;
  prefix: string;
  created_at: string;
  expires_at: string | null;
  last_used_at: string | null;
  revoked: boolean;
  token?: string;
}

export type Shape = (number | string | null)[];

export interface TensorSpec {
  name: string;
  dtype: string;
  shape: Shape;
}

export interface PyTorchConversion {
  format?: string;
  exporter?: 'dynamo' | 'torchscript';
  fallback_reason?: string | null;
  parity?: { passed: boolean; min_cosine: number; threshold: number; samples: number };
  torch_parameter_count?: number;
}

export interface ModelVersion {
  /** On upload: earlier versions with exactly the same bytes. */
  identical_to?: IdenticalVersion[];
  id: number;
  number: number;
  sha256: string;
  size_bytes: number;
  source_format: string;
  filename: string;
  signature: { inputs: TensorSpec[]; outputs: TensorSpec[] };
  opset: number | null;
  op_histogram: Record<string, number>;
  parameter_count: number | null;
  validation: { ok: boolean; error: string | null } | null;
  /** Per output: the kind Kiln judges it by, what it inferred and why, and whether the user overrode it. */
  output_kinds?: Record<string, OutputKindInfo>;
  /** PyTorch uploads: how the ONNX was exported and how closely it matches PyTorch. */
  conversion?: PyTorchConversion;
  created_at: string;
  download_url: string;
  /** What each runtime said about the model's operators: the server's, and each agent's, newest per runtime version. */
  operator_support?: { answers?: SupportAnswer[] };
}

/** One runtime's answer to "which of this model's operators do you run?" (devices/support.py). */
export interface SupportAnswer {
  backend: string;
  runtime?: string | null;
  version?: string | null;
  device?: string | null;
  source?: string | null;
  verdict: 'runs' | 'partial' | 'cannot_run' | 'unknown';
  reason?: string | null;
  native?: Record<string, number>;
  fallback?: Record<string, number>;
  unsupported?: Record<string, number>;
  nodes?: { fallback?: string[]; unsupported?: string[] };
  /** Who answered: "server", or the agent's name (model page). */
  where?: string;
  at?: string;
}

export const OUTPUT_KINDS = [
  'class_scores',
  'class_ids',
  'probability_map',
  'dense',
  'embedding',
  'detection',
  'regression',
] as const;
export type OutputKind = (typeof OUTPUT_KINDS)[number];

export interface OutputKindInfo {
  kind: OutputKind | null;
  inferred: OutputKind | null;
  reason: string;
  overridden: boolean;
}

/** What a job may declare per output (`kind` of a declared metric). */
export const DECLARED_METRIC_KINDS = [
  'top1_agreement',
  'top5_agreement',
  'id_agreement',
  'mask_iou',
  'relative_l2',
  'sqnr',
  'cosine',
  'detection',
  'accuracy',
  'top5_accuracy',
  'mean_iou',
  'ctc',
  'plugin',
] as const;
export type DeclaredMetricKind = (typeof DECLARED_METRIC_KINDS)[number];

export interface DeclaredMetric {
  output: string;
  kind: DeclaredMetricKind;
  primary?: boolean;
  threshold?: number;
  match_iou?: number;
  nms_iou?: number;
  blank?: number;
  plugin?: string;
}

export interface Model {
  id: number;
  name: string;
  created_at: string;
  latest_version: ModelVersion | null;
  versions?: ModelVersion[];
  /** On upload: earlier versions with exactly the same bytes. */
  identical_to?: IdenticalVersion[];
}

export interface IdenticalVersion {
  model: number;
  name: string;
  version: number;
  version_id: number;
}

export type DatasetKind = 'calibration' | 'validation';

export interface Dataset {
  id: number;
  name: string;
  kind: DatasetKind;
  samples: number;
  arrays: Record<string, { dtype: string; shape: Shape }>;
  has_labels: boolean;
  /** `npz` (named arrays) or `samples` (a zip of one .npz per sample). */
  format?: 'npz' | 'samples';
  /** The declared preprocessing that made this dataset from raw images, audio or text (empty for arrays). */
  recipe?: DatasetRecipe | Record<string, never>;
  /** The first samples as the recipe made them: thumbnails, waveform envelopes or text with its tokens. */
  previews?: DatasetPreview[];
  sha256: string;
  /** The digest of the file uploaded (for raw data, the zip before the recipe): the same files twice have the same one. */
  source_sha256?: string;
  size_bytes: number;
  created_at: string;
}

export interface DatasetRecipe {
  type: 'image' | 'audio' | 'text';
  input?: string;
  inputs?: Record<string, string | TextInputSpec>;
  size?: [number, number];
  resize?: string;
  color?: string;
  scale?: number;
  mean?: number[];
  std?: number[];
  layout?: string;
  dtype?: string;
  sample_rate?: number;
  resample?: boolean;
  length?: number | null;
  max_length?: number;
  label_names?: string[];
  tokenizer_sha256?: string;
}

/** A text input fed in another form than the tokenizer's: its own dtype, per-sample shape or an additive mask. */
export interface TextInputSpec {
  field: string;
  dtype?: string;
  shape?: number[];
  additive?: number;
}

export interface DatasetPreview {
  name: string;
  thumbnail?: string;
  seconds?: number;
  sample_rate?: number;
  peak?: number;
  envelope?: number[];
  text?: string;
  tokens?: string[];
  length?: number;
  /** An image's [height, width] as the model gets it (the thumbnail is of the prepared tensor). */
  size?: [number, number];
}

export const PRECISIONS = ['fp32', 'bf16', 'fp16', 'int8', 'int8-dynamic', 'int4-weight'] as const;
export type Precision = (typeof PRECISIONS)[number];

export const METRICS = [
  'auto',
  'accuracy',
  'cosine',
  'sqnr',
  'top1_agreement',
  'mask_iou',
  'relative_l2',
  'detection_f1',
  'mean_iou',
  'sequence_accuracy',
  'cer',
] as const;
export type ToleranceMetric = (typeof METRICS)[number];

export interface Tolerance {
  metric: ToleranceMetric | string;
  max_drop?: number;
  /** For the sqnr metric: the lowest acceptable SQNR in dB. */
  min_value?: number;
}

export type JobStatus = 'queued' | 'running' | 'waiting_for_devices' | 'succeeded' | 'failed' | 'canceled';
export const TERMINAL_JOB_STATUSES: JobStatus[] = ['succeeded', 'failed', 'canceled'];

export interface JobStage {
  name: string;
  status: 'pending' | 'running' | 'done' | 'skipped' | 'failed';
  started_at: string | null;
  finished_at: string | null;
  message: string | null;
  /** Seconds over every finished run of the stage (a search runs quantize and devices once per round). */
  seconds?: number;
  runs?: number;
}

export interface JobEvent {
  at: string;
  stage: string | null;
  level: 'info' | 'warning' | 'error';
  message: string;
}

export interface JobVariant {
  id: number;
  key?: string;
  round?: number;
  options?: Record<string, unknown> | null;
  precision: string;
  /** What it computes in: a bf16 variant is an FP32 build run under OpenVINO's bf16 hint. */
  effective_precision?: string;
  backends: string[];
  recipe: Record<string, unknown> | null;
  status: string;
  error: string | null;
  size_bytes: number | null;
  sha256: string | null;
}

export interface DeviceTask {
  id: number;
  variant: number;
  backend: string;
  /** measure: one variant compiled, timed and evaluated; retime: the device's finalists timed again side by side. */
  purpose: 'measure' | 'retime';
  agent: { id: number; name: string } | null;
  target: string | null;
  status: 'queued' | 'leased' | 'succeeded' | 'failed' | 'canceled';
  attempt: number;
  stage: string | null;
  message: string | null;
  progress: number | null;
  error: string | null;
}

export interface Job {
  id: number;
  status: JobStatus;
  stage: string;
  progress: number;
  error: string | null;
  model_version: number;
  /** The support stage: every runtime's answer, and the backends it skipped with the reason. */
  support?: { answers?: SupportAnswer[]; skipped?: Record<string, string> };
  model: { id: number; name: string; version?: number; sha256?: string } | null;
  precisions: string[];
  targets: (number | string)[];
  tolerance: Tolerance;
  metrics?: DeclaredMetric[];
  evaluation?: EvaluationPlan | null;
  calibration_dataset: number | null;
  validation_dataset: number | null;
  stages?: JobStage[];
  events?: JobEvent[];
  variants?: JobVariant[];
  device_tasks?: DeviceTask[];
  created_at: string;
  finished_at: string | null;
  rerun_of?: number | null;
  package?: { encrypt?: boolean } | null;
  toolchain?: { host?: Record<string, string> } | null;
  /** The `auto` search's time budget ({} for explicit precisions). */
  budget?: SearchBudget | Record<string, never>;
  /** Per device, once reported: the recommended variant and its speed-up over FP32. */
  outcome?: JobOutcome[];
  /** Why it waits now ("waiting for a build slot: 2 jobs ahead"), or null. */
  waiting?: JobWaiting | null;
}

export interface JobOutcome {
  device: string;
  agent: number | null;
  /** The decision's label: effective precision first ("int8 · int8-mse on onnxruntime"). */
  recommended: string | null;
  speedup: number | null;
  /** The interval language against FP32: faster, slower or tie. */
  comparison?: Comparison | null;
  /** The decision's own short cell ("2.41x faster", "1.04x (tie)", "FP32 itself"); null for reports stored before decisions. */
  speedup_text?: string | null;
  beyond_noise: boolean | null;
  tie: boolean;
  accuracy: { metric: string | null; value: number | null; drop: number | null } | null;
  verdict: string | null;
}

export type Comparison = 'faster' | 'slower' | 'tie';

export interface SearchBudget {
  minutes: number;
  started_at: number | null;
  /** Seconds of the job's own build and device time so far: what the budget counts (never time spent waiting). */
  work_seconds?: number;
  seconds_left: number | null;
  /** When round 1 was measured and the report first held an answer (epoch seconds), while the search goes on. */
  first_answer_at?: number | null;
  stopped: string | null;
}

/** Why a job waits now, and how many are ahead of it (null while it works or once it ended). */
export interface JobWaiting {
  cause: 'builds_paused' | 'memory' | 'organization_limit' | 'build_slot' | 'check_slot' | 'worker' | 'device_busy';
  position: number | null;
  since: string | null;
  message: string;
}

export interface JobCreate {
  model_version: number;
  precisions: string[];
  calibration_dataset: number | null;
  validation_dataset: number | null;
  targets: (number | string)[];
  tolerance: Tolerance;
  metrics?: DeclaredMetric[];
  /** Outputs fed to inputs on the next call of a sequence, e.g. {"stateN": "state"}. */
  state?: Record<string, string>;
  initial_state?: Record<string, number>;
  calibration_subset?: { count: number; seed: number; stratify: boolean } | null;
  /** The `auto` search's time budget in minutes. */
  budget_minutes?: number;
}

export interface EvaluationPlan {
  outputs: { name: string; kind: OutputKind; primary: boolean; reason?: string; declared?: DeclaredMetric[] }[];
  labels?: boolean;
}

export interface Artifact {
  id: number;
  kind: 'converted' | 'variant' | 'compiled' | 'reference' | string;
  name: string;
  precision: string | null;
  backend: string | null;
  sha256: string;
  size_bytes: number;
  download_url: string;
}

export interface Capabilities {
  os?: string;
  arch?: string;
  cpu_model?: string;
  cores?: number;
  isa?: string[];
  memory_mb?: number;
  gpu?: Record<string, unknown> | null;
  runtimes?: Record<string, string>;
  agent_version?: string;
  [key: string]: unknown;
}

export interface Agent {
  id: number;
  name: string;
  labels: Record<string, string>;
  capabilities: Capabilities;
  online: boolean;
  last_heartbeat_at: string | null;
  current_task: number | null;
  revoked: boolean;
  created_at: string;
}

export interface RegistrationToken {
  id: number;
  name: string;
  prefix?: string;
  created_at?: string;
  /** When it stops enrolling devices; null: never. */
  expires_at?: string | null;
  expired?: boolean;
  revoked?: boolean;
  token?: string;
  register_command?: string;
}

/** GET agents/setup/: the server's address as devices reach it and how to install the agent there. */
export interface AgentSetup {
  server_url: string;
  source: 'KILN_PUBLIC_URL' | 'request';
  loopback: boolean;
  warning: string | null;
  suggested_urls: string[];
  downloads_url: string;
  downloads_configured: boolean;
  agent_distribution: string;
  install_command: string;
  runtimes: { name: string; package: string; note: string }[];
}

/** GET models/{id}/versions/{n}/recipe/: the recipe Kiln proposes for raw data, and why. */
export interface RecipeProposal {
  recipe: DatasetRecipe | null;
  input: string | null;
  why: string[];
}

/** POST datasets/preview/: what a recipe makes of the first files, and whether it fits the model. */
export interface RawPreview {
  files: number;
  arrays: Record<string, { dtype: string; shape: number[]; min: number | null; max: number | null }>;
  previews: (DatasetPreview & { label?: string | null })[];
  /** Files per class folder, over every file chosen. */
  classes?: Record<string, number>;
  recipe: DatasetRecipe;
  fits: { ok: boolean; problems: string[] } | null;
}

export interface LatencyMs {
  p50: number | null;
  p90: number | null;
  p99: number | null;
  mean: number | null;
  std: number | null;
  cv?: number | null;
}

export interface AccuracyResult {
  metric: string;
  value: number | null;
  reference_value?: number | null;
  drop: number | null;
  within_tolerance: boolean | null;
  [key: string]: unknown;
}

export interface OpTypeTime {
  op_type: string;
  time_ms: number;
  share: number;
  count: number;
}

export interface ReportVariant {
  id: number;
  task?: number;
  key?: string;
  /** What runs, named (devices/labels.py): "bf16 · fp32+static+ov-bf16 on openvino". */
  label?: string;
  /** fp32, bf16, fp16, int8, int4 weights or mixed. */
  effective_precision?: string;
  round?: number;
  options?: Record<string, unknown> | null;
  backend: string;
  precision: string;
  recipe: Record<string, unknown> | null;
  /** Which measurement set every figure of the row comes from: a finalist's side-by-side rounds, or the task's first pass. */
  measurement_set?: 'side by side' | 'first pass';
  latency_ms: LatencyMs | null;
  latency_ms_first_pass?: LatencyMs | null;
  /** The task's own benchmark, kept apart from a re-timed row's figures (memory and load time are measured there). */
  first_pass?: { latency_ms: LatencyMs | null; throughput_per_s?: number | null; peak_memory_mb?: number | null; load_ms?: number | null } | null;
  timing?: { source?: string; window_medians_ms?: number[]; interleaved_medians_ms?: number[]; windows?: QuietWindow[] } | null;
  /** A quiet window stayed busy after its re-takes: the figure is marked. */
  busy?: boolean;
  throughput_per_s: number | null;
  load_ms?: number | null;
  first_inference_ms?: number | null;
  peak_memory_mb: number | null;
  threads?: number | null;
  unstable?: boolean;
  size_bytes: number | null;
  accuracy: AccuracyResult | null;
  profile?: { by_op_type?: OpTypeTime[]; by_node?: unknown[] } | null;
  artifact: { id: number; sha256: string; download_url: string } | null;
  pareto: boolean;
  status?: string;
  error?: string | null;
  regression?: Regression | null;
}

export interface Regression {
  flagged: boolean;
  slowdown: number | null;
  baseline: number;
  baseline_job: number | null;
  baseline_p50_ms: number;
  baseline_backend_version?: string;
}

export interface DeviceEstimate {
  backend: string;
  estimated_p50_ms: number | null;
  measured_p50_ms: number;
  error: number | null;
  coverage: number;
  models: number;
  note?: string;
}

export interface ReportDevice {
  agent: { id: number; name: string; capabilities?: Capabilities } | null;
  target?: string;
  variants: ReportVariant[];
  recommended: number | null;
  reason: string | null;
  /** False while the job still runs: the figures so far, updated live. */
  final?: boolean;
  /** The recommended variant bundled with its report and a run script. */
  package?: { id: number; name: string; download_url: string } | null;
  /** What the performance database predicted before measuring, and its error. */
  estimate?: DeviceEstimate | null;
  /** What FP32 itself scores on this device, per backend: what "1%" is read against. */
  fp32_noise?: Fp32Noise[];
  /** The one decision on this device (workers/scoring.py `decide`): every view renders it, none rewords it. */
  decision?: Decision | null;
  /** The decision under its earlier name. */
  verdict?: Decision | null;
  /** The decision's "why not the others": one row per precision family, and one per failure. */
  alternatives?: WhyNotRow[];
  /** The device's timing noise, told once. */
  noise?: DecisionNoise | null;
  /** The finalists timed side by side, when the device re-timed them. */
  measurement?: DecisionMeasurement | null;
}

/** A latency ratio (slow p50 / fast p50) with its 95% interval, where it comes from, and what it says. */
export interface LatencyRatio {
  ratio: number;
  low: number;
  high: number;
  source: string;
  comparison?: Comparison;
  beyond_noise: boolean;
  rounds?: number | null;
  per_round?: number[];
  /** The ratio and its interval as the server prints them, with the digits that decide them ("1.002x to 1.05x"). */
  ratio_text?: string;
  interval_text?: string;
}

export interface Decision {
  variant: number | null;
  label: string | null;
  effective_precision?: string | null;
  text: string;
  /** The speed clause against FP32, and its short form for cells. */
  speed?: string | null;
  short?: string | null;
  cost?: string | null;
  comparison?: Comparison | null;
  tie: boolean;
  tied_with: ({ variant: number; label: string; reason?: string } & LatencyRatio)[];
  speedup: ({ baseline: number; baseline_label?: string } & LatencyRatio) | null;
  accuracy: { metric: string | null; value: number | null; drop: number | null } | null;
  within_tolerance?: boolean;
  alternatives?: WhyNotRow[];
  noise?: DecisionNoise | null;
  measurement?: DecisionMeasurement | null;
  /** Set when the windows the decision rests on were busy: it says so, and Kiln re-times once the device is quiet. */
  provisional?: { busy: number; windows: number; attempts: number; busiest: string[]; text: string } | null;
}

/** @deprecated the decision's earlier name */
export type Verdict = Decision;

export interface DecisionNoise {
  text: string;
  unstable?: number;
  timed?: number;
  retaken?: number;
  busy?: number;
}

export interface DecisionMeasurement {
  source: string;
  rounds: number;
  stopped: string | null;
  stopped_text?: string;
  finalists: {
    variant: number;
    label: string;
    p50_ms: number;
    round_medians_ms: number[];
    against_recommended?: LatencyRatio;
  }[];
}

/** One quiet timing window (devices/quiet.py): the load around it and whether it had to be re-taken. */
export interface QuietWindow {
  attempt?: number;
  seconds?: number;
  competing_cores?: number;
  limit_cores?: number;
  busy?: boolean;
  retaken?: number;
  busiest?: string[];
  before?: { loadavg: number[] | null; cpu_mhz: number | null };
  after?: { loadavg: number[] | null; cpu_mhz: number | null };
}

export interface WhyNotRow {
  family: string;
  variants: number;
  variant: number | null;
  /** A build that never reached a device: the variant's id. */
  build?: number;
  label: string;
  p50_ms: number | null;
  drop: number | null;
  metric: string | null;
  /** slower, tie, outside tolerance, failed, build failed, refused (a runtime that cannot read the built variant), not measured… */
  outcome?: string;
  why: string;
}

export interface Fp32Noise {
  backend: string;
  metric: string | null;
  output: string | null;
  value: number | null;
  drop: number | null;
  sqnr_db?: number | null;
  within_tolerance?: boolean | null;
}

export interface SensitivityRow {
  node: string;
  op_type: string;
  sqnr_db: number;
  relative_error?: number;
}

/** One step of a sequence job's accuracy (devices/feeds.py per_step_figures): every sequence's call t against FP32's. */
export interface PerStepRow {
  step: number;
  sequences: number;
  outputs: Record<string, { cosine: number | null; max_abs_error: number | null }>;
}

/** The calibration samples a job used (workers/calibration_set.py): how many, drawn how, and which. */
export interface CalibrationUsed {
  samples: number;
  calls: number;
  of: number;
  seed?: number;
  stratified?: boolean;
  by_label?: Record<string, number> | null;
  indices?: number[];
  indices_listed?: number;
}

/** How the job's data was fed and which calibration samples were chosen (reports/selectors.py _datasets_summary). */
export interface ReportDatasets {
  calibration?: { mode: string; format: string };
  validation?: { mode: string; format: string };
  state?: Record<string, string>;
  calibration_subset?: { count: number; seed?: number; stratify?: boolean } | null;
  calibration_used?: CalibrationUsed | null;
}

/** What the `auto` search did (reports/selectors.py `_search_summary`). */
export interface SearchSummaryData {
  auto?: boolean;
  rounds: number;
  /** Per round, the candidates it built and how each build went. */
  tried?: { round: number; variants: { key: string; effective_precision: string; backends: string[]; status: string; error: string }[] }[];
  sensitivity: SensitivityRow[];
  /** Why no layers were ranked, when none were. */
  sensitivity_note?: string;
  budget_minutes?: number | null;
  stopped?: string | null;
  /** Per device target: why each family was searched or dropped, and which compile options won. */
  notes?: Record<string, string[]>;
}

export interface Report {
  job: number;
  status: JobStatus;
  tolerance: Tolerance;
  metrics?: DeclaredMetric[];
  evaluation?: EvaluationPlan | null;
  search?: SearchSummaryData;
  datasets?: ReportDatasets;
  devices: ReportDevice[];
  rerun?: {
    job: number;
    differences: string[];
    latency: { variant_key: string; backend: string; agent: string; before_p50_ms: number; after_p50_ms: number; ratio: number | null; regression: boolean }[];
  } | null;
}

export interface Measurement {
  id: number;
  job: number | null;
  model: { id: number | null; name: string; version: number | null };
  model_sha256: string;
  variant_key: string;
  precision: string;
  effective_precision?: string;
  label?: string;
  /** Whether its job's decision recommended this variant on this device. */
  recommended?: boolean;
  backend: string;
  backend_version: string;
  agent: { id: number | null; name: string };
  device_key: string;
  agent_version: string;
  latency_ms: LatencyMs;
  p50_ms: number;
  std_ms: number;
  peak_memory_mb: number | null;
  accuracy: AccuracyResult | Record<string, never>;
  regression: Regression | null;
  measured_at: string;
}

export interface ModelEstimate {
  model_version: number;
  devices: {
    agent: { id: number | null; name: string };
    device: string;
    backend: string;
    p50_ms: number;
    /** The range: the estimate divided and multiplied by `factor`, the worst leave-one-out miss on the device (or a prior). */
    low_ms?: number;
    high_ms?: number;
    factor?: number;
    /** How many of the device's models were each predicted from the others to set the range (0: the prior). */
    checked_models?: number;
    coverage: number;
    models: number;
  }[];
  measured: { agent_name: string; backend: string; p50_ms: number; job_id: number | null }[];
}
