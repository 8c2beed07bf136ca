import { partial } from '../test/partial';
import { screen, waitFor } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { ModelEstimate, ModelVersion } from '../api/types';
import { json, meResponse, renderWithClient } from '../test/render';
import { OutputKinds } from './ModelDetailPage';

const version = partial<ModelVersion>({
  id: 11,
  number: 2,
  sha256: 'abc',
  size_bytes: 2048,
  source_format: 'onnx',
  filename: 'det.onnx',
  signature: {
    inputs: [{ name: 'x', dtype: 'float32', shape: ['N', 3, 'H', 'W'] }],
    outputs: [{ name: 'maps', dtype: 'float32', shape: ['N', 1, 'H', 'W'] }],
  },
  opset: 14,
  op_histogram: { Conv: 2 },
  parameter_count: 1234,
  validation: { ok: true, error: null },
  output_kinds: {
    maps: { kind: 'probability_map', inferred: 'probability_map', reason: 'Sigmoid output: independent probabilities per pixel', overridden: false },
  },
  created_at: '2026-01-01T00:00:00Z',
  download_url: '/api/v1/models/1/versions/2/download/',
});

describe('OutputKinds', () => {
  const fetchMock = vi.fn<typeof fetch>();
  beforeEach(() => {
    document.cookie = 'csrftoken=tok; path=/';
    vi.stubGlobal('fetch', fetchMock);
    fetchMock.mockReset();
    fetchMock.mockImplementation(async (input, init) => {
      const url = String(input);
      if (url === '/api/v1/auth/me/') return meResponse();
      if (url === '/api/v1/models/1/versions/2/' && init?.method === 'PATCH') return json(version);
      return json({ error: 'not found' }, 404);
    });
  });
  afterEach(() => vi.unstubAllGlobals());

  function renderKinds(shown: ModelVersion) {
    renderWithClient(<OutputKinds modelId={1} version={shown} />);
  }

  it('shows the inferred kind with its reason and metric, and overrides it', async () => {
    renderKinds(version);
    expect(screen.getByText(/Sigmoid output/)).toBeInTheDocument();
    expect(screen.getByText(/mask IoU at 0.5/)).toBeInTheDocument();
    const select = screen.getByLabelText('Kind of maps') as HTMLSelectElement;
    expect(select.value).toBe('probability_map');
    await waitFor(() => expect(select).not.toBeDisabled());
    await userEvent.selectOptions(select, 'dense');
    await waitFor(() => expect(fetchMock.mock.calls.some(([, init]) => init?.method === 'PATCH')).toBe(true));
    const [, init] = fetchMock.mock.calls.find(([, call]) => call?.method === 'PATCH')!;
    expect(JSON.parse(String(init?.body))).toEqual({ output_kinds: { maps: 'dense' } });
  });

  it('shows a heat map as Kiln infers it, judged by its regions, with every kind the contract knows on offer', async () => {
    renderKinds({
      ...version,
      output_kinds: { maps: { kind: 'heat_map', inferred: 'heat_map', reason: 'one Sigmoid channel per pixel', overridden: false } },
    });
    const select = screen.getByLabelText('Kind of maps') as HTMLSelectElement;
    expect(select.value).toBe('heat_map');
    expect(screen.getByText(/region F1 against FP32/)).toBeInTheDocument();
    expect(Array.from(select.options, (option) => option.value)).toEqual([
      'class_scores', 'class_ids', 'probability_map', 'heat_map', 'distribution', 'dense', 'embedding', 'detection', 'regression',
    ]);
  });

  it('offers to go back to the inferred kind once overridden', async () => {
    renderKinds({
      ...version,
      output_kinds: { maps: { kind: 'dense', inferred: 'probability_map', reason: 'Sigmoid output', overridden: true } },
    });
    expect(screen.getByText(/set by you; Kiln inferred Probability map/)).toBeInTheDocument();
    const reset = screen.getByRole('button', { name: 'Use inferred' });
    await waitFor(() => expect(reset).not.toBeDisabled());
    await userEvent.click(reset);
    await waitFor(() => expect(fetchMock.mock.calls.some(([, init]) => init?.method === 'PATCH')).toBe(true));
    const [, init] = fetchMock.mock.calls.find(([, call]) => call?.method === 'PATCH')!;
    expect(JSON.parse(String(init?.body))).toEqual({ output_kinds: { maps: null } });
  });
});

describe('estimate beside the measurement', () => {
  it('puts the measured p50 first and says how far off the estimate was', async () => {
    const { estimateRows } = await import('./ModelDetailPage');
    const rows = estimateRows(partial<ModelEstimate>({
      model_version: 1,
      devices: [
        { agent: { id: 1, name: 'pi5' }, device: 'pi5|arm', backend: 'onnxruntime', p50_ms: 90, coverage: 0.3, models: 1 },
        { agent: { id: 2, name: 'orin' }, device: 'orin|arm', backend: 'onnxruntime', p50_ms: 4720, coverage: 0.9, models: 2 },
      ],
      measured: [{ agent_name: 'orin', backend: 'onnxruntime', p50_ms: 40, job_id: 5 }],
    }));
    expect(rows.map((row) => [row.device, row.measuredMs])).toEqual([['orin', 40], ['pi5', null]]);
    expect(rows[0].ratio).toBeCloseTo(118);
  });

  it('shows a measurement even where there is nothing to estimate from', async () => {
    const { estimateRows } = await import('./ModelDetailPage');
    const rows = estimateRows(partial<ModelEstimate>({ model_version: 1, devices: [], measured: [{ agent_name: 'orin', backend: 'onnxruntime', p50_ms: 40, job_id: 5 }, { agent_name: 'orin', backend: 'onnxruntime', p50_ms: 41, job_id: 4 }] }));
    expect(rows.map((row) => [row.device, row.measuredMs, row.estimateMs])).toEqual([['orin', 40, null]]);
  });

  it("gives a new kind of model's estimate a range from the device's own record", async () => {
    const { estimateRows, uncertaintyNote } = await import('./ModelDetailPage');
    const [checked, prior] = estimateRows(partial<ModelEstimate>({
      model_version: 1,
      devices: [
        { agent: { id: 1, name: 'box' }, device: 'box|x86', backend: 'onnxruntime', p50_ms: 12, low_ms: 8, high_ms: 18, factor: 1.5, checked_models: 3,
          coverage: 0.2, models: 3 },
        { agent: { id: 2, name: 'pi5' }, device: 'pi5|arm', backend: 'onnxruntime', p50_ms: 90, low_ms: 30, high_ms: 270, factor: 3, checked_models: 0,
          coverage: 1, models: 1 },
      ],
      measured: [],
    }));
    expect([checked.lowMs, checked.highMs]).toEqual([8, 18]);
    expect(uncertaintyNote(checked)).toBe(
      'within 1.5x either way: the worst miss when each of the 3 models measured here was predicted from the others; most of its operator types never ran on this device (a new kind of model)');
    expect(uncertaintyNote(prior)).toBe('within 3x either way: only one other model was measured here, so nothing checks the fit yet');
  });
});
