import { describe, expect, it } from 'vitest';
import type { Measurement } from '../api/types';
import { buyingModel, compareJobs, fastestPerDevice, jobsIn, jobsLike, p50ByToolchain } from './performance';

function row(job: number, agent: string, p50: number, extra: Partial<Measurement> = {}): Measurement {
  return {
    id: job * 100 + p50, job, model: { id: 1, name: 'digits', version: 1 }, model_sha256: 'a', variant_key: 'fp32', precision: 'fp32',
    backend: 'onnxruntime', backend_version: '1.32', agent: { id: 1, name: agent }, device_key: `${agent}|cpu`, agent_version: '0.1',
    latency_ms: { p50, p90: p50, p99: p50, mean: p50, std: 0.01 }, p50_ms: p50, std_ms: 0.01, peak_memory_mb: null, accuracy: {}, regression: null,
    measured_at: '2026-01-01T00:00:00Z', ...extra,
  };
}

describe('performance summaries', () => {
  it('ranks devices by their fastest variant', () => {
    const ranked = fastestPerDevice([row(1, 'slow', 3), row(1, 'fast', 1), row(2, 'slow', 2.5)]);
    expect(ranked.map((entry) => [entry.label, entry.p50])).toEqual([['fast · onnxruntime', 1], ['slow · onnxruntime', 2.5]]);
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
    const rows = [row(1, 'orin', 40), row(1, 'pi5', 90), row(2, 'orin', 0.009, toy)];
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
