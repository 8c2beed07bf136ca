import { partial } from '../test/partial';
import { screen, waitFor } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { Agent, Dataset, Model, ModelVersion } from '../api/types';
import {
  emptyDeploymentForm,
  toJobCreate,
  validateDeployment,
  type DeploymentForm,
  type MetricDraft,
} from './deploymentValidation';
import { json, meResponse, renderRoutes } from '../test/render';
import { NewDeploymentPage } from './NewDeploymentPage';

const version = partial<ModelVersion>({
  id: 11,
  number: 1,
  sha256: 'abc',
  size_bytes: 2048,
  source_format: 'onnx',
  filename: 'digits.onnx',
  signature: {
    inputs: [{ name: 'input', dtype: 'float32', shape: ['batch', 1, 8, 8] }],
    outputs: [{ name: 'logits', dtype: 'float32', shape: ['batch', 10] }],
  },
  opset: 17,
  op_histogram: { Conv: 2 },
  parameter_count: 1234,
  validation: { ok: true, error: null },
  output_kinds: { logits: { kind: 'class_scores', inferred: 'class_scores', reason: 'a Gemm over classes', overridden: false } },
  created_at: '2026-01-01T00:00:00Z',
  download_url: '/api/v1/models/1/versions/1/download/',
});
const model: Model = { id: 1, name: 'digits', created_at: '2026-01-01T00:00:00Z', latest_version: version, versions: [version] };

function dataset(id: number, kind: Dataset['kind'], arrays: string[], hasLabels = false): Dataset {
  return partial<Dataset>({
    id,
    name: `${kind}-${id}`,
    kind,
    samples: 100,
    arrays: Object.fromEntries(arrays.map((name) => [name, { dtype: 'float32', shape: [100, 1, 8, 8] }])),
    has_labels: hasLabels,
    sha256: 'x',
    size_bytes: 10,
    created_at: '2026-01-01T00:00:00Z',
  });
}
const calibration = dataset(2, 'calibration', ['input']);
const validation = dataset(3, 'validation', ['input', 'labels'], true);
const agent: Agent = {
  id: 5,
  name: 'lab-box',
  labels: { arch: 'x86' },
  capabilities: { cpu_model: 'Xeon', cores: 8, runtimes: { onnxruntime: '1.20.1' } },
  online: true,
  last_heartbeat_at: new Date().toISOString(),
  current_task: null,
  revoked: false,
  created_at: '2026-01-01T00:00:00Z',
};
const context = { version, datasets: [calibration, validation], agents: [agent] };
const form = (patch: Partial<DeploymentForm>): DeploymentForm => ({ ...emptyDeploymentForm, modelVersion: 11, ...patch });

describe('validateDeployment', () => {
  it('accepts a complete form', () => {
    const result = validateDeployment(form({ calibrationDataset: 2, validationDataset: 3 }), context);
    expect(result.errors).toEqual({});
  });

  it('requires a model version', () => {
    expect(validateDeployment(form({ modelVersion: null }), context).errors.modelVersion).toMatch(/Choose a model/);
  });

  it('requires a calibration dataset for int8 but not for int8-dynamic', () => {
    const int8 = validateDeployment(form({ precisionMode: 'explicit', precisions: ['fp32', 'int8'] }), context);
    expect(int8.errors.calibrationDataset).toMatch(/int8 needs a calibration dataset/);
    const dynamic = validateDeployment(form({ precisionMode: 'explicit', precisions: ['int8-dynamic'] }), context);
    expect(dynamic.errors.calibrationDataset).toBeUndefined();
  });

  it('requires at least one explicit precision', () => {
    expect(validateDeployment(form({ precisionMode: 'explicit', precisions: [] }), context).errors.precisions).toBeDefined();
  });

  it('checks that datasets have an array for every model input', () => {
    const wrong = dataset(7, 'calibration', ['pixels']);
    const result = validateDeployment(form({ calibrationDataset: 7 }), { ...context, datasets: [wrong, validation] });
    expect(result.errors.calibrationDataset).toMatch(/does not fit this model: no array named “input”/);
  });

  it('needs labelled validation data for the accuracy metric', () => {
    const unlabelled = dataset(8, 'validation', ['input']);
    const result = validateDeployment(form({ metric: 'accuracy', validationDataset: 8 }), { ...context, datasets: [unlabelled] });
    expect(result.errors.validationDataset).toMatch(/no labels/);
    expect(validateDeployment(form({ metric: 'accuracy' }), context).errors.validationDataset).toMatch(/needs a validation dataset/);
  });

  it('takes the drop in percent and refuses a negative, unreadable or over-100% value', () => {
    expect(validateDeployment(form({ maxDrop: '-0.1' }), context).errors.maxDrop).toMatch(/cannot be negative/);
    expect(validateDeployment(form({ maxDrop: 'abc' }), context).errors.maxDrop).toMatch(/not a percentage/);
    expect(validateDeployment(form({ metric: 'cosine', maxDrop: '200%' }), context).errors.maxDrop).toMatch(/at most 100%/);
    expect(validateDeployment(form({ metric: 'sqnr', maxDrop: '3' }), context).errors.maxDrop).toBeUndefined();
    expect(validateDeployment(form({ metric: 'sqnr', maxDrop: '30 dB' }), context).errors.maxDrop).toBeUndefined();
    expect(validateDeployment(form({ maxDrop: '1%' }), context).errors.maxDrop).toBeUndefined();
  });

  it('sends "1%" and "1" alike as a drop of 0.01, and a dB floor for sqnr', () => {
    expect(toJobCreate(form({ maxDrop: '1%' })).tolerance).toEqual({ metric: 'auto', max_drop: 0.01 });
    expect(toJobCreate(form({ maxDrop: ' 1 ' })).tolerance).toEqual({ metric: 'auto', max_drop: 0.01 });
    expect(toJobCreate(form({ maxDrop: '0,5 %', metric: 'cosine' })).tolerance).toEqual({ metric: 'cosine', max_drop: 0.005 });
    expect(toJobCreate(form({ maxDrop: '0.07' })).tolerance).toEqual({ metric: 'auto', max_drop: 0.0007 });
    expect(toJobCreate(form({ maxDrop: '35 dB', metric: 'sqnr' })).tolerance).toEqual({ metric: 'sqnr', min_value: 35 });
  });

  it('requires a chosen device when targeting selected devices, and warns when none is online', () => {
    expect(validateDeployment(form({ targetMode: 'selected' }), context).errors.targets).toBeDefined();
    const offline = validateDeployment(form({}), { ...context, agents: [{ ...agent, online: false }] });
    expect(offline.warnings.join(' ')).toMatch(/No device is online/);
  });

  it('warns when calibration and validation are the same files', () => {
    const same = { ...validation, source_sha256: 'f00d' };
    const warnings = validateDeployment(form({ calibrationDataset: 2, validationDataset: 3 }), {
      ...context, datasets: [{ ...calibration, source_sha256: 'f00d' }, same] }).warnings;
    expect(warnings.join(' ')).toMatch(/“calibration-2” and “validation-3” are the same files/);
    const apart = validateDeployment(form({ calibrationDataset: 2, validationDataset: 3 }), {
      ...context, datasets: [{ ...calibration, source_sha256: 'beef' }, same] }).warnings;
    expect(apart.join(' ')).not.toMatch(/same files/);
  });

  it('builds the API body', () => {
    expect(
      toJobCreate(form({ precisionMode: 'explicit', precisions: ['fp32', 'int8'], calibrationDataset: 2, targetMode: 'selected', targets: [5, 'label=arch=x86'] })),
    ).toEqual({
      model_version: 11,
      precisions: ['fp32', 'int8'],
      calibration_dataset: 2,
      validation_dataset: null,
      targets: [5, 'label=arch=x86'],
      tolerance: { metric: 'auto', max_drop: 0.01 },
      metrics: [],
    });
    expect(toJobCreate(form({})).precisions).toEqual(['auto']);
    expect(toJobCreate(form({})).budget_minutes).toBe(10);
    expect(toJobCreate(form({})).targets).toEqual([]);
  });
});

describe('declared metrics', () => {
  const draft = (patch: Partial<MetricDraft>): MetricDraft => ({
    output: 'logits',
    kind: 'mask_iou',
    primary: true,
    threshold: '',
    blank: '0',
    plugin: '',
    ...patch,
  });
  const errorOf = (metrics: MetricDraft[], validationDataset: number | null = 3) =>
    validateDeployment(form({ metrics, validationDataset }), context).errors.metrics;

  it('accepts a declared metric on an output of the model', () => {
    expect(errorOf([draft({ threshold: '0.3' })])).toBeUndefined();
  });

  it('names the problem: unknown output, threshold out of range, missing blank or plugin, labels needed', () => {
    expect(errorOf([draft({ output: 'probabilities' })])).toMatch(/one of the model's outputs/);
    expect(errorOf([draft({ threshold: '1.5' })])).toMatch(/strictly between 0 and 1/);
    expect(errorOf([draft({ kind: 'ctc', blank: '' })])).toMatch(/blank index/);
    expect(errorOf([draft({ kind: 'plugin', plugin: '../x' })])).toMatch(/entry point/);
    expect(errorOf([draft({ kind: 'accuracy' })], null)).toMatch(/needs a validation dataset with labels/);
    expect(errorOf([draft({}), draft({})])).toMatch(/already declared/);
  });

  it('sends only the options each metric takes', () => {
    const body = toJobCreate(
      form({
        metrics: [
          draft({ threshold: '0.3' }),
          draft({ kind: 'ctc', blank: '0', threshold: '0.9', primary: false }),
          draft({ kind: 'plugin', plugin: 'my_f1', primary: false }),
        ],
      }),
    );
    expect(body.metrics).toEqual([
      { output: 'logits', kind: 'mask_iou', primary: true, threshold: 0.3 },
      { output: 'logits', kind: 'ctc', primary: false, blank: 0 },
      { output: 'logits', kind: 'plugin', primary: false, plugin: 'my_f1' },
    ]);
  });
});

describe('NewDeploymentPage', () => {
  const fetchMock = vi.fn<typeof fetch>();
  beforeEach(() => {
    document.cookie = 'csrftoken=tok; path=/';
    vi.stubGlobal('fetch', fetchMock);
    fetchMock.mockReset();
    fetchMock.mockImplementation(async (input, init) => {
      const url = String(input);
      if (url.startsWith('/api/v1/models/?') || url === '/api/v1/models/') return json({ count: 1, next: null, previous: null, results: [model] });
      if (url === '/api/v1/models/1/') return json(model);
      if (url === '/api/v1/datasets/' || url.startsWith('/api/v1/datasets/?')) return json([calibration, validation]);
      if (url === '/api/v1/auth/me/') return meResponse();
      if (url === '/api/v1/agents/') return json([agent]);
      if (url === '/api/v1/jobs/' && init?.method === 'POST') return json({ id: 42, status: 'queued' }, 201);
      return json({ error: 'not found' }, 404);
    });
  });
  afterEach(() => vi.unstubAllGlobals());

  function renderPage() {
    renderRoutes(
      [
        { path: '/deployments/new', element: <NewDeploymentPage /> },
        { path: '/jobs/:jobId', element: <p>job page</p> },
      ],
      '/deployments/new?model=1&version=11',
    );
  }

  const jobPosts = () => fetchMock.mock.calls.filter(([url, init]) => url === '/api/v1/jobs/' && init?.method === 'POST');

  it('chooses the only dataset that fits each slot, and leaves a slot the user set to None alone', async () => {
    renderPage();
    await screen.findByRole('option', { name: 'v1 (digits.onnx)' }, { timeout: 5000 });
    await waitFor(() => expect(screen.getByLabelText('Calibration dataset')).toHaveValue('2'));
    expect(screen.getByLabelText('Validation dataset')).toHaveValue('3');
    expect(screen.getByTestId('calibration-compatibility')).toHaveTextContent('the only one that fits, chosen for you');
    // With labels, auto judges the class scores by top-1 accuracy against them, and says so for this model and data.
    expect(screen.getByTestId('metric-help')).toHaveTextContent('For this model and “validation-3” (labelled): top-1 accuracy of output “logits” against its labels.');
    expect(screen.getByTestId('max-drop-meaning')).toHaveTextContent('1% = 1 point of top-1 accuracy: with FP32 at 90%, a variant at 89% still passes.');
    await userEvent.selectOptions(screen.getByLabelText('Validation dataset'), '');
    expect(screen.getByLabelText('Validation dataset')).toHaveValue('');
    expect(screen.getByTestId('metric-help')).toHaveTextContent('top-1 agreement of output “logits” against FP32; with a labelled validation set, task accuracy');
  });

  it('sends the search budget with auto, and checks it as it is typed', async () => {
    renderPage();
    await screen.findByRole('option', { name: 'v1 (digits.onnx)' }, { timeout: 5000 });
    const budget = screen.getByTestId('budget-input');
    expect(budget).toHaveValue('10');
    await userEvent.clear(budget);
    await userEvent.type(budget, '0');
    expect(screen.getByText(/The search budget is a whole number of minutes from 1 to 1440/)).toBeInTheDocument();
    await userEvent.clear(budget);
    await userEvent.type(budget, '25');
    await waitFor(() => expect(screen.getByRole('button', { name: 'Start deployment' })).toBeEnabled());
    await userEvent.click(screen.getByRole('button', { name: 'Start deployment' }));
    await screen.findByText('job page');
    expect(JSON.parse(String(jobPosts()[0][1]?.body))).toMatchObject({ precisions: ['auto'], budget_minutes: 25 });
  });

  it('blocks int8 without a calibration dataset and says why', async () => {
    renderPage();
    await screen.findByRole('option', { name: 'v1 (digits.onnx)' }, { timeout: 5000 });
    // The only fitting calibration set is chosen for you; choosing None is the user's own call.
    await waitFor(() => expect(screen.getByLabelText('Calibration dataset')).toHaveValue('2'));
    await userEvent.selectOptions(screen.getByLabelText('Calibration dataset'), '');
    await userEvent.click(screen.getByTestId('precision-explicit'));
    await userEvent.click(screen.getByTestId('precision-int8'));
    await waitFor(() => expect(screen.getByRole('button', { name: 'Start deployment' })).toBeEnabled());
    await userEvent.click(screen.getByRole('button', { name: 'Start deployment' }));
    expect(screen.getByTestId('form-errors')).toHaveTextContent('int8 needs a calibration dataset');
    expect(screen.getByLabelText('Calibration dataset')).toHaveAttribute('aria-invalid', 'true');
    expect(jobPosts()).toHaveLength(0);
  });

  it('submits a valid deployment and opens the job', async () => {
    renderPage();
    await screen.findByRole('option', { name: 'v1 (digits.onnx)' }, { timeout: 5000 });
    await screen.findByRole('option', { name: /calibration-2/ });
    await userEvent.click(screen.getByTestId('precision-explicit'));
    await userEvent.click(screen.getByTestId('precision-int8'));
    await userEvent.selectOptions(screen.getByLabelText('Calibration dataset'), '2');
    await userEvent.selectOptions(screen.getByLabelText('Validation dataset'), '3');
    await screen.findByText('lab-box');
    await userEvent.click(screen.getByTestId('targets-selected'));
    await userEvent.click(screen.getByTestId('target-agent-5'));
    // Declare the logits as the primary output, judged by top-1 accuracy against the labels.
    await userEvent.click(screen.getByTestId('add-metric'));
    await userEvent.selectOptions(screen.getByLabelText('Metric kind'), 'accuracy');
    await waitFor(() => expect(screen.getByRole('button', { name: 'Start deployment' })).toBeEnabled());
    await userEvent.click(screen.getByRole('button', { name: 'Start deployment' }));
    await screen.findByText('job page');
    expect(jobPosts()).toHaveLength(1);
    expect(JSON.parse(String(jobPosts()[0][1]?.body))).toEqual({
      model_version: 11,
      precisions: ['int8'],
      calibration_dataset: 2,
      validation_dataset: 3,
      targets: [5],
      tolerance: { metric: 'auto', max_drop: 0.01 },
      metrics: [{ output: 'logits', kind: 'accuracy', primary: true }],
    });
  });

  it('does not let a viewer start a deployment', async () => {
    const base = fetchMock.getMockImplementation()!;
    fetchMock.mockImplementation(async (input, init) => {
      if (String(input) === '/api/v1/auth/me/') {
        const organization = { id: 1, name: 'Acme', slug: 'acme', role: 'viewer' };
        return new Response(JSON.stringify({ user: { id: 1, username: 'ada' }, organization, organizations: [organization] }));
      }
      return base(input, init);
    });
    renderPage();
    await screen.findByRole('option', { name: 'v1 (digits.onnx)' }, { timeout: 5000 });
    await waitFor(() => expect(screen.getByRole('button', { name: 'Start deployment' })).toBeDisabled());
  });

  it("shows the server's message when it refuses the job", async () => {
    const base = fetchMock.getMockImplementation()!;
    fetchMock.mockImplementation(async (input, init) => {
      if (String(input) === '/api/v1/jobs/' && init?.method === 'POST') {
        return new Response(JSON.stringify({ error: 'No online agent has onnxruntime.', code: 'no_targets' }), { status: 400 });
      }
      return base(input, init);
    });
    renderPage();
    await screen.findByRole('option', { name: 'v1 (digits.onnx)' }, { timeout: 5000 });
    await waitFor(() => expect(screen.getByRole('button', { name: 'Start deployment' })).toBeEnabled());
    await userEvent.click(screen.getByRole('button', { name: 'Start deployment' }));
    await waitFor(() => expect(screen.getByText(/No online agent has onnxruntime\./)).toBeInTheDocument());
  });
});
