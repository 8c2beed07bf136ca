import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Report, ReportDevice, ReportVariant } from '../../api/types';
// A real agent's report (tests/e2e/test_ui.py, two FP32 builds on one device), dumped from an e2e run.
import agentReport from './fixtures/agent-report.json';
import { opTypeBars, profileCaption } from './profile';

const report = agentReport as unknown as Report;
const device = report.devices[0];

// jsdom has neither matchMedia (uPlot reads it at import) nor a 2D canvas nor Path2D: give uPlot inert ones,
// so that its real scale, axis and hook code runs.
beforeAll(() => {
  window.matchMedia = ((query: string) => ({ matches: false, media: query, addListener() {}, removeListener() {}, addEventListener() {}, removeEventListener() {} })) as never;
  HTMLCanvasElement.prototype.getContext = function getContext() {
    return new Proxy({}, { get: (_target, key) => (key === 'measureText' ? (text: string) => ({ width: text.length * 6 }) : () => undefined), set: () => true });
  } as never;
  // A Path2D whose every method does nothing.
  (globalThis as { Path2D?: unknown }).Path2D = function Path2D() {
    return new Proxy({}, { get: () => () => undefined });
  };
});

async function charts() {
  return import('./ReportCharts');
}

describe('latency-accuracy scatter on a real agent report', () => {
  it('keeps every axis range open when all points share one accuracy (the "Loading charts…" freeze)', async () => {
    const { scatterModel, toleranceThreshold } = await charts();
    expect(device.variants.every((variant) => variant.accuracy?.value === 1)).toBe(true);
    const model = scatterModel(device, toleranceThreshold(device, report.tolerance), 'top1_agreement');
    expect(model).not.toBeNull();
    for (const [low, high] of [model!.home.x, model!.home.y]) {
      expect(Number.isFinite(low) && Number.isFinite(high)).toBe(true);
      expect(high - low).toBeGreaterThan(0);
    }
    expect(model!.legend.map((entry) => entry.label)).toEqual(['Within tolerance', 'Recommended', 'Tolerance']);
  });

  it('draws with uPlot, names every point and zooms with the buttons', async () => {
    const { LatencyAccuracyScatter } = await charts();
    render(<LatencyAccuracyScatter device={device} tolerance={report.tolerance} />);
    const chart = screen.getByTestId('latency-accuracy-chart');
    const labels = await screen.findAllByTestId('point-label');
    expect(labels.map((label) => label.textContent).sort()).toEqual(['fp32 · onnxruntime', 'fp32 · openvino']);
    expect(within(screen.getByTestId('chart-legend')).getAllByRole('listitem').map((item) => item.textContent)).toEqual([
      'Within tolerance', 'Recommended', 'Tolerance',
    ]);
    const width = () => Number(chart.dataset.xMax) - Number(chart.dataset.xMin);
    const before = width();
    expect(screen.getByTestId('zoom-reset')).toBeDisabled();
    await userEvent.click(screen.getByTestId('zoom-in'));
    expect(width()).toBeCloseTo(before / 2, 6);
    await userEvent.click(screen.getByTestId('zoom-reset'));
    expect(width()).toBeCloseTo(before, 6);
  });

  it('leaves " on <backend>" off the chart names when every point runs on one backend, and the caption says which', async () => {
    const { pointText, scatterModel, toleranceThreshold } = await charts();
    const one = (variant: ReportVariant, id: number, label: string) => ({ ...variant, id, backend: 'onnxruntime', label });
    const shared = { ...device, variants: [one(device.variants[0], 1, 'fp32 on onnxruntime'), one(device.variants[0], 2, 'int8 · int8-dynamic on onnxruntime')] };
    const model = scatterModel(shared, toleranceThreshold(shared, report.tolerance), 'top1_agreement')!;
    expect(model.sharedBackend).toBe('onnxruntime');
    expect(model.points.map((variant) => pointText(variant, false, model.sharedBackend)).sort()).toEqual(['fp32', 'int8 · int8-dynamic']);
    expect(pointText(model.points[1], true, model.sharedBackend)).toMatch(/^int8 · int8-dynamic \(1, off the scale\)$|^fp32 \(1, off the scale\)$/);
    // Two backends: the names keep them (the real report's two FP32 builds).
    expect(scatterModel(device, toleranceThreshold(device, report.tolerance), 'top1_agreement')!.sharedBackend).toBeNull();
  });

  it('says how many variants are not plotted instead of labelling a point that has no accuracy', async () => {
    const { LatencyAccuracyScatter } = await charts();
    const unmeasured: ReportVariant = { ...device.variants[1], id: 99, accuracy: { value: null, within_tolerance: false } };
    render(<LatencyAccuracyScatter device={{ ...device, variants: [...device.variants, unmeasured] } as ReportDevice} tolerance={report.tolerance} />);
    expect(screen.getByTestId('scatter-caption')).toHaveTextContent('1 variant has no latency or accuracy and is not plotted.');
    expect(await screen.findAllByTestId('point-label')).toHaveLength(2);
  });
});

describe('per-operator numbers', () => {
  const variant = device.variants[0];

  it('scales the bars to the p50 and says why the profiler measured more', () => {
    const bars = opTypeBars(variant);
    const p50 = variant.latency_ms!.p50 as number;
    expect(bars.reduce((sum, bar) => sum + (bar.ofP50Ms ?? 0), 0)).toBeCloseTo(p50, 6);
    expect(bars.every((bar) => (bar.ofP50Ms ?? 0) <= p50)).toBe(true);
    const caption = profileCaption(variant, 'fp32 · onnxruntime');
    expect(caption).toContain('so the bars add up to the p50');
    expect(caption).toContain('a mean per run over 10 runs of a separate session with per-node timing on, first (cold) run included and no warm-up');
    expect(caption).toMatch(/\d+\.\dx the p50, because of the cold run and the profiler's overhead per node/);
  });

  it('says when the agent left a warm-up run out', () => {
    const warmed = { ...variant, profile: { ...variant.profile, warmup_runs: 1 } } as ReportVariant;
    const caption = profileCaption(warmed, 'fp32 · onnxruntime');
    expect(caption).toContain('a mean per run over 10 runs of a separate session with per-node timing on, after 1 warm-up run left out');
    expect(caption).not.toContain('cold');
  });

  it('lists the slowest layers beside their INT8 sensitivity, matching names the runtime rewrote', async () => {
    const { LayerTable } = await charts();
    render(<LayerTable variant={variant} sensitivity={[{ node: 'relu1', op_type: 'Conv', sqnr_db: 21.46 }]} />);
    const rows = within(screen.getByTestId('layer-table')).getAllByTestId('layer-row');
    const first = within(rows[0]).getAllByRole('cell').map((cell) => cell.textContent);
    // Under the model's own name, the runtime's beneath it.
    expect(first[0]).toBe('relu1runtime: relu1_nchwc');
    expect(first[5]).toBe('21.5');
    expect(within(rows[1]).getAllByRole('cell')[5]).toHaveTextContent('—');
    expect(screen.getByTestId('layer-table')).toHaveTextContent('1 of these layers were ranked by the search');
  });

  it("names an OpenVINO node by the model's nodes it runs, with the worst of their INT8 sensitivities", async () => {
    const { LayerTable } = await charts();
    const fused = {
      ...variant,
      profile: {
        ...(variant.profile as object),
        by_node: [{ name: 'Multiply_615451', op_type: 'Convolution', time_ms: 0.5, share: 0.9, layers: ['conv1', 'relu1'] }],
      },
    } as typeof variant;
    render(<LayerTable variant={fused} sensitivity={[{ node: 'conv1', op_type: 'Conv', sqnr_db: 30 }, { node: 'relu1', op_type: 'Relu', sqnr_db: 18.2 }]} />);
    const cells = within(screen.getAllByTestId('layer-row')[0]).getAllByRole('cell').map((cell) => cell.textContent);
    expect(cells[0]).toBe('conv1 + relu1runtime: Multiply_615451');
    expect(cells[5]).toBe('18.2');
  });
});
