import { partial } from '../../test/partial';
import { render, screen, within } from '@testing-library/react';
import { describe, expect, it } from 'vitest';

import type { PerStepRow, ReportVariant } from '../../api/types';
import { PerStepAccuracy, stepSeries, worstStep } from './PerStepAccuracy';

function steps(cosines: number[], errors: number[]): PerStepRow[] {
  return cosines.map((cosine, step) => ({
    step,
    sequences: 4,
    outputs: { output: { cosine, max_abs_error: errors[step] }, stateN: { cosine: 1, max_abs_error: 0 } },
  }));
}

function variant(id: number, precision: string, perStep: PerStepRow[] | undefined): ReportVariant {
  return partial<ReportVariant>({ id, key: precision, backend: 'onnxruntime', precision, recipe: {}, latency_ms: null, throughput_per_s: null,
    peak_memory_mb: null, size_bytes: null, artifact: null, pareto: false,
    accuracy: { metric: 'cosine', value: 0.99, drop: 0.01, within_tolerance: true, ...(perStep ? { per_step: perStep } : {}) } });
}

describe('PerStepAccuracy', () => {
  it('draws one chart per output with a line per variant, and the worst step of each', () => {
    const fp32 = variant(1, 'fp32', steps([1, 1, 1], [0, 1e-7, 0]));
    const int8 = variant(2, 'int8', steps([0.999, 0.97, 0.985], [0.01, 0.2, 0.05]));
    render(<PerStepAccuracy variants={[fp32, int8]} />);
    const output = screen.getByTestId('per-step-chart-output');
    expect(within(output).getByRole('img', { name: 'Cosine per step of output, one line per variant' })).toBeInTheDocument();
    expect(output.querySelectorAll('polyline')).toHaveLength(2);
    expect(screen.getByTestId('per-step-chart-stateN')).toBeInTheDocument();
    expect(screen.getByText(/over 4 sequences/)).toBeInTheDocument();
    const row = within(screen.getByTestId('per-step-table')).getAllByRole('row').find((candidate) => candidate.textContent?.startsWith('int8 · onnxruntimeoutput'));
    expect(row?.textContent).toBe('int8 · onnxruntimeoutput30.9712.00e-1');
  });

  it('picks the lowest cosine and the largest error, skipping missing steps', () => {
    const [series] = stepSeries([variant(2, 'int8', steps([0.99, 0.95, 0.98], [0.1, 0.05, 0.3]))]);
    expect(worstStep(series)).toEqual({ step: 1, cosine: 0.95, maxAbsError: 0.3 });
    expect(worstStep({ ...series, cosine: [null, null, null], maxAbsError: [null, null, null] })).toEqual({ step: null, cosine: null, maxAbsError: null });
  });

  it('shows nothing for variants that did not run sequences', () => {
    const { container } = render(<PerStepAccuracy variants={[variant(1, 'fp32', undefined), variant(2, 'int8', [])]} />);
    expect(container).toBeEmptyDOMElement();
  });
});
