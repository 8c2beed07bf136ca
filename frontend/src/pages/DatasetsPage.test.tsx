import { partial } from '../test/partial';
import { describe, expect, it } from 'vitest';
import type { Dataset } from '../api/types';
import { classSummary, recipeText, sameFilesWarning } from './DatasetsPage';

const dataset = (id: number, kind: Dataset['kind'], name: string): Dataset => (partial<Dataset>({
  id, name, kind, samples: 40, arrays: {}, has_labels: true, sha256: 'npz', source_sha256: 'zip', size_bytes: 1, created_at: '2026-01-01T00:00:00Z',
}));

describe('the dataset preview', () => {
  it('names every class with its count', () => {
    expect(classSummary({ circle: 10, square: 10, star: 7, triangle: 3 })).toBe('4 classes: circle 10, square 10, star 7, triangle 3');
    expect(classSummary({ photos: 4 })).toBe('1 class: photos 4');
    expect(classSummary({})).toBeNull();
  });

  it('warns when the files are already the other kind of dataset', () => {
    expect(sameFilesWarning([dataset(1, 'calibration', 'shapes')], 'validation')).toMatch(/^These are the same files as the calibration dataset “shapes”/);
    expect(sameFilesWarning([dataset(1, 'validation', 'shapes')], 'validation')).toBe('These files are already the validation dataset “shapes”.');
    expect(sameFilesWarning([], 'validation')).toBeNull();
  });

  it('writes the proposed scale as 1/255, which the server reads back', () => {
    const text = recipeText({ type: 'image', size: [32, 32], scale: 1 / 255 });
    expect(text).toContain('"scale": "1/255"');
    expect(JSON.parse(text).scale).toBe('1/255');
  });
});
