import { partial } from '../../test/partial';
import { render, screen, within } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import type { ReportDatasets } from '../../api/types';
import { CalibrationSubset } from './CalibrationSubset';

describe('CalibrationSubset', () => {
  it('shows the count, the seed, the stratification, each label share and the indices used', () => {
    render(
      <CalibrationSubset
        datasets={partial<ReportDatasets>({
          calibration_subset: { count: 40, seed: 3, stratify: true },
          calibration_used: { samples: 40, calls: 40, of: 300, seed: 3, stratified: true, by_label: { '0': 30, '1': 10 },
            indices: [2, 5, 9], indices_listed: 3 },
        })}
      />,
    );
    expect(screen.getByTestId('calibration-summary')).toHaveTextContent(
      '40 of 300 samples (40 calls), drawn with seed 3, stratified by label (each label keeps its share of the set).');
    const rows = within(screen.getByTestId('calibration-labels')).getAllByRole('row').map((row) => row.textContent);
    expect(rows).toEqual(['LabelSamplesShare', '03075.0%', '11025.0%']);
    expect(screen.getByTestId('calibration-indices')).toHaveTextContent('the first 3 of 40): 2, 5, 9');
  });

  it('says why a subset is not stratified', () => {
    render(<CalibrationSubset datasets={partial<ReportDatasets>({ calibration_subset: { count: 2, seed: 0, stratify: true },
      calibration_used: { samples: 2, calls: 16, of: 6, seed: 0, stratified: false, by_label: null, indices: [1, 4] } })} />);
    expect(screen.getByTestId('calibration-summary')).toHaveTextContent('2 of 6 samples (16 calls), drawn with seed 0, not stratified (the set has no labels).');
    expect(screen.queryByTestId('calibration-labels')).toBeNull();
    expect(screen.getByTestId('calibration-indices')).toHaveTextContent('(index in the calibration set): 1, 4');
  });

  it('names the whole set for a sequence job that calibrated on all of it, the draw to come, and nothing otherwise', () => {
    const { rerender, container } = render(<CalibrationSubset datasets={partial<ReportDatasets>({ calibration_used: { samples: 6, calls: 48, of: 6 } })} />);
    expect(screen.getByTestId('calibration-summary')).toHaveTextContent('6 of 6 samples (48 calls), the whole calibration set, in order.');
    rerender(<CalibrationSubset datasets={partial<ReportDatasets>({ calibration_subset: { count: 5, seed: 7 } })} />);
    expect(screen.getByTestId('calibration-summary')).toHaveTextContent('5 samples will be drawn with seed 7 when the job calibrates.');
    rerender(<CalibrationSubset datasets={partial<ReportDatasets>({ state: {} })} />);
    expect(container).toBeEmptyDOMElement();
  });
});
