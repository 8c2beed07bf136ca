import { partial } from '../test/partial';
import { describe, expect, it } from 'vitest';
import type { Measurement } from '../api/types';
import { buyingModel, compareJobs, devicesWithoutAPass, fastestPerDevice, jobsIn, jobsLike, p50ByToolchain } from './performance';

function row(job: number, agent: string, p50: number, extra: Partial<Measurement> = {}): Measurement {
  return partial<Measurement>({
    id: job * 100 + p50, job, model: { id: 1, name: 'digits', version: 1 }, model_sha256: 'a', variant_key: 'fp32', precision: 'fp32',
    backend: 'onnxruntime', backend_version: '1.32', agent: { id: 1, name: agent }, device_key: `${agent}|cpu`, agent_version: '0.1',
    latency_ms: { p50, p90: p50, p99: p50, mean: p50, std: 0.01 }, p50_ms: p50, std_ms: 0.01, peak_memory_mb: null, accuracy: {}, regression: null,
    measured_at: '2026-01-01T00:00:00Z', ...extra,
  });
}

const PASS = { accuracy: { metric: 'top1_agreement', value: 0.999, within_tolerance: true } } as Partial<Measurement>;
const MISS = { accuracy: { metric: 'mask_iou', value: 0.947, within_tolerance: false } } as Partial<Measurement>;

describe('performance summaries', () => {
  it('ranks devices by their fastest variant within tolerance', () => {
    const ranked = fastestPerDevice([row(1, 'slow', 3, PASS), row(1, 'fast', 1, PASS), row(2, 'slow', 2.5, PASS)]);
    expect(ranked.map((entry) => [entry.label, entry.p50])).toEqual([['fast · onnxruntime', 1], ['slow · onnxruntime', 2.5]]);
  });

  it('answers "which device" with a variant within tolerance, not a faster one that breaks the model', () => {
    // Issue 37: an INT8 build at 22.9 ms with mask IoU 0.947 once answered instead of the recommended FP32 at 102.7 ms.
    const rows = [
      row(1, 'orin', 22.9, { ...MISS, variant_key: 'int8', label: 'int8 on litert' }),
      row(1, 'orin', 102.7, { ...PASS, variant_key: 'fp32', label: 'fp32 on litert', recommended: true }),
      row(1, 'pi5', 300, MISS),
    ];
    const [pick, ...rest] = fastestPerDevice(rows);
    expect(rest).toEqual([]);
    expect(pick).toMatchObject({ label: 'orin · onnxruntime', p50: 102.7, variant: 'fp32 on litert', recommended: true, fasterOutside: 1 });
    expect(devicesWithoutAPass(rows)).toEqual(['pi5 · onnxruntime']);
  });

  it('groups one device by runtime version', () => {
    const groups = p50ByToolchain([row(1, 'box', 1), row(2, 'box', 3, { backend_version: '1.33' }), row(3, 'box', 2)]);
    expect(groups).toEqual([{ label: 'box · onnxruntime 1.32', p50: 1.5, count: 2 }, { label: 'box · onnxruntime 1.33', p50: 3, count: 1 }]);
  });

  it('compares a job with an earlier one cell by cell', () => {
    const rows = [row(1, 'box', 2), row(2, 'box', 3), row(2, 'other', 1)];
    expect(jobsIn(rows)).toEqual([2, 1]);
    const table = compareJobs(rows, 2, 1);
    expect(table.find((cell) => cell.device === 'box')).toMatchObject({ before: 2, after: 3, ratio: 1.5 });
    expect(table.find((cell) => cell.device === 'other')).toMatchObject({ before: null, after: 1, ratio: null });
  });
});

describe('defaults that compare like with like', () => {
  it('answers "which device" for the model measured on the most devices, not the fastest toy model', () => {
    const toy = { model: { id: 9, name: 'toy', version: 1 }, model_sha256: 'toy' };
    const rows = [row(1, 'orin', 40, PASS), row(1, 'pi5', 90, PASS), row(2, 'orin', 0.009, { ...toy, ...PASS })];
    const chosen = buyingModel(rows);
    expect(chosen?.name).toBe('digits');
    expect(fastestPerDevice(chosen!.rows).map((entry) => entry.p50)).toEqual([40, 90]);
  });

  it('offers to compare a job only with jobs of the same model', () => {
    const other = { model: { id: 2, name: 'encoder', version: 1 }, model_sha256: 'encoder' };
    const rows = [row(3, 'box', 2), row(2, 'box', 0.1, other), row(1, 'box', 2.1)];
    expect(jobsLike(rows, 3)).toEqual([3, 1]);
    expect(jobsLike(rows, 2)).toEqual([2]);
    // A byte-identical upload under another name is the same model.
    expect(jobsLike([...rows, row(4, 'box', 2.2, { model: { id: 5, name: 'digits-copy', version: 1 } })], 4)).toEqual([4, 3, 1]);
  });
});
