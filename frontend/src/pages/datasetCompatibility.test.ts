import { partial } from '../test/partial';
import { describe, expect, it } from 'vitest';
import type { Dataset, ModelVersion } from '../api/types';
import { datasetCompatibility, mismatchMessage, splitByCompatibility } from './datasetCompatibility';

const version = {
  id: 1, number: 1, signature: { inputs: [{ name: 'input', dtype: 'float32', shape: ['batch', 1, 8, 8] }], outputs: [] },
} as unknown as ModelVersion;

function dataset(id: number, name: string, arrays: Dataset['arrays'], samples = 100): Dataset {
  return partial<Dataset>({ id, name, kind: 'validation', samples, arrays, has_labels: false, sha256: '', size_bytes: 0, created_at: '' });
}

const digits = dataset(1, 'digits', { input: { dtype: 'float32', shape: [100, 1, 8, 8] } });
const cifar = dataset(2, 'cifar', { input: { dtype: 'float32', shape: [50, 3, 32, 32] } });
const flat = dataset(3, 'flat', { input: { dtype: 'float32', shape: [50, 64] } });
const renamed = dataset(4, 'renamed', { pixels: { dtype: 'float32', shape: [50, 1, 8, 8] }, labels: { dtype: 'int64', shape: [50] } });
const empty = dataset(5, 'broken', { input: { dtype: 'float32', shape: [0, 1, 8, 8] } }, -1);
const ints = dataset(6, 'ints', { input: { dtype: 'int64', shape: [10, 1, 8, 8] } });

describe('dataset compatibility', () => {
  it('accepts a dataset whose arrays have the model’s per-sample shape', () => {
    expect(datasetCompatibility(digits, version)).toEqual({ fits: true, problems: [] });
  });

  it('names the axis that differs', () => {
    expect(datasetCompatibility(cifar, version).problems).toEqual([
      '“input” is [N, 3, 32, 32] here, the model takes [batch, 1, 8, 8] (axis 1: 3, not 1)',
    ]);
    expect(datasetCompatibility(flat, version).problems[0]).toContain('(4 dimensions, not 2)');
  });

  it('names a missing input and what the file has instead', () => {
    expect(datasetCompatibility(renamed, version).problems).toEqual(['no array named “input” (it has “pixels”)']);
  });

  it('rejects a dataset without readable samples and one of the wrong type', () => {
    expect(datasetCompatibility(empty, version).problems).toContain('it holds no samples that could be read');
    expect(datasetCompatibility(ints, version).problems).toEqual(['“input” is int64 here, the model takes float32']);
  });

  it('splits a list into those that fit and those that do not, and words the mismatch for the field', () => {
    const split = splitByCompatibility([digits, cifar, renamed, empty], version);
    expect(split.fitting.map((item) => item.dataset.name)).toEqual(['digits']);
    expect(split.misfits.map((item) => item.dataset.name)).toEqual(['cifar', 'renamed', 'broken']);
    expect(mismatchMessage(cifar, datasetCompatibility(cifar, version))).toBe(
      '“cifar” does not fit this model: “input” is [N, 3, 32, 32] here, the model takes [batch, 1, 8, 8] (axis 1: 3, not 1).',
    );
    expect(mismatchMessage(digits, datasetCompatibility(digits, version))).toBeNull();
  });

  it('treats symbolic and unknown model dimensions as matching anything', () => {
    const dynamic = { ...version, signature: { inputs: [{ name: 'input', dtype: 'float32', shape: ['batch', 'c', null, 8] }], outputs: [] } } as unknown as ModelVersion;
    expect(datasetCompatibility(cifar, dynamic).problems).toEqual([
      '“input” is [N, 3, 32, 32] here, the model takes [batch, c, ?, 8] (axis 3: 32, not 8)',
    ]);
    expect(datasetCompatibility(digits, dynamic).fits).toBe(true);
  });
});
