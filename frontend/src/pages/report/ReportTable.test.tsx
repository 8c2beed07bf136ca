import { partial } from '../../test/partial';
import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { describe, expect, it } from 'vitest';
import type { ReportVariant } from '../../api/types';
import { accuracyErrors, ReportTable, sortVariants } from './ReportTable';

function variant(id: number, precision: string, p50: number | null, value: number | null, within = true): ReportVariant {
  return partial<ReportVariant>({
    id,
    backend: 'onnxruntime',
    precision,
    recipe: {},
    latency_ms: p50 === null ? null : { p50, p90: p50 * 1.1, p99: p50 * 1.3, mean: p50, std: 0.01 },
    throughput_per_s: p50 ? 1000 / p50 : null,
    peak_memory_mb: 20,
    size_bytes: 1000 * id,
    accuracy: value === null ? { value: null, within_tolerance: false } : { metric: 'accuracy', value, drop: 0.97 - value, within_tolerance: within },
    artifact: { id: 100 + id, sha256: 'x', download_url: `/api/v1/artifacts/${100 + id}/download/` },
    pareto: false,
  });
}

const variants = [
  variant(1, 'fp32', 2.0, 0.97),
  variant(2, 'int8', 0.8, 0.965),
  variant(3, 'fp16', 1.5, 0.97),
  variant(4, 'int4-weight', null, null),
  variant(5, 'int8-dynamic', 1.1, 0.9, false),
];

const precisionsInOrder = () =>
  screen.getAllByRole('row').slice(1).map((row) => within(row).getAllByRole('cell')[0].querySelector('strong')?.textContent);

describe('ReportTable', () => {
  it('sorts by latency p50, fastest first, by default, with unmeasured variants last', () => {
    render(<ReportTable variants={variants} recommended={2} deviceName="box" />);
    expect(precisionsInOrder()).toEqual(['int8', 'int8-dynamic', 'fp16', 'fp32', 'int4-weight']);
    expect(screen.getByRole('columnheader', { name: /Latency p50/ })).toHaveAttribute('aria-sort', 'ascending');
  });

  it('sorts by a clicked column and reverses on a second click', async () => {
    render(<ReportTable variants={variants} recommended={2} deviceName="box" />);
    const accuracy = screen.getByRole('button', { name: /^Accuracy/ });
    await userEvent.click(accuracy);
    expect(screen.getByRole('columnheader', { name: /^Accuracy/ })).toHaveAttribute('aria-sort', 'ascending');
    expect(precisionsInOrder()).toEqual(['int8-dynamic', 'int8', 'fp32', 'fp16', 'int4-weight']);
    await userEvent.click(accuracy);
    expect(screen.getByRole('columnheader', { name: /^Accuracy/ })).toHaveAttribute('aria-sort', 'descending');
    expect(precisionsInOrder()).toEqual(['fp32', 'fp16', 'int8', 'int8-dynamic', 'int4-weight']);
    expect(screen.getByRole('columnheader', { name: /Latency p50/ })).toHaveAttribute('aria-sort', 'none');
  });

  it('highlights the recommended variant wherever sorting puts it', async () => {
    render(<ReportTable variants={variants} recommended={2} deviceName="box" />);
    const row = screen.getByTestId('recommended-row');
    expect(row).toHaveClass('row-recommended');
    expect(row).toHaveAttribute('data-variant-id', '2');
    expect(within(row).getByText('Recommended')).toBeInTheDocument();
    expect(screen.getAllByText('Recommended')).toHaveLength(1);
    await userEvent.click(screen.getByRole('button', { name: /^Size/ }));
    expect(screen.getByTestId('recommended-row')).toHaveAttribute('data-variant-id', '2');
  });

  it('shows drop vs FP32, tolerance and a download link per variant', () => {
    render(<ReportTable variants={variants} recommended={2} deviceName="box" />);
    const row = screen.getByTestId('recommended-row');
    expect(within(row).getByText('−0.005')).toBeInTheDocument();
    expect(within(row).getByText('Yes')).toBeInTheDocument();
    expect(within(row).getByRole('link', { name: 'Download int8 · onnxruntime for box' })).toHaveAttribute(
      'href',
      '/api/v1/artifacts/102/download/',
    );
    const outside = screen.getAllByTestId('variant-row').find((r) => r.getAttribute('data-variant-id') === '5')!;
    expect(within(outside).getByText('No')).toBeInTheDocument();
  });

  it('labels a re-timed row as side by side and shows its first pass apart', () => {
    const retimed = partial<ReportVariant>({
      ...variant(2, 'int8', 0.8, 0.965), measurement_set: 'side by side', peak_memory_mb: null,
      timing: { source: 'side by side', interleaved_medians_ms: [0.8, 0.81, 0.79] },
      first_pass: { latency_ms: { p50: 1.25, p90: 1.3, p99: 1.4, mean: 1.25, std: 0.01 }, peak_memory_mb: 20 },
    });
    render(<ReportTable variants={[variant(1, 'fp32', 2.0, 0.97), retimed]} recommended={2} deviceName="box" />);
    const row = screen.getByTestId('recommended-row');
    expect(within(row).getByTestId('side-by-side-mark')).toHaveTextContent('side by side · first pass 1.25 ms');
    expect(screen.getAllByTestId('side-by-side-mark')).toHaveLength(1);
  });

  it('sortVariants keeps missing values last in both directions', () => {
    expect(sortVariants(variants, 'p50', 'descending').map((v) => v.id)).toEqual([1, 3, 5, 2, 4]);
  });
});

describe('accuracyErrors', () => {
  it('lists each metric that failed, by output, and labels that fit nothing', () => {
    const errors = accuracyErrors({
      metric: 'mask_iou',
      value: 0.99,
      drop: 0.01,
      within_tolerance: true,
      outputs: { maps: { errors: { 'plugin:f1': 'RuntimeError: the plugin fell over' } }, aux: { errors: {} } },
      labels: { output: null, shape: [4, 3], error: 'labels of shape [4, 3] fit no metric of any output' },
    });
    expect(errors).toEqual(['maps plugin:f1: RuntimeError: the plugin fell over', 'labels of shape [4, 3] fit no metric of any output']);
    expect(accuracyErrors(null)).toEqual([]);
  });
});

describe('CSV name', () => {
  it('carries the job id and the device', async () => {
    const { reportCsvName } = await import('./ReportTable');
    expect(reportCsvName(17, 'orin nano/lab')).toBe('kiln-report-job-17-orin-nano-lab.csv');
  });
});
