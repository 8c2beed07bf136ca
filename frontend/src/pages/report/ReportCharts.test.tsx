import { render, screen, within } from '@testing-library/react';
import { describe, expect, it, vi } from 'vitest';
import type { ReportVariant } from '../../api/types';
import { LayerTable, profileCaption } from './ReportCharts';

// uPlot reads window.matchMedia at import, which jsdom lacks; these tests draw no chart.
vi.mock('uplot', () => ({ default: class {} }));

function variant(p50: number, opTimes: number[]): ReportVariant {
  return {
    id: 1, key: 'int8', precision: 'int8', backend: 'onnxruntime', recipe: null, latency_ms: { p50, p90: p50, p99: p50, mean: p50, std: 0 },
    throughput_per_s: null, peak_memory_mb: null, size_bytes: null, accuracy: null, artifact: null, pareto: true,
    profile: {
      by_op_type: opTimes.map((time_ms, index) => ({ op_type: `Op${index}`, time_ms, share: 0.5, count: 1 })),
      by_node: [{ name: 'conv1', op_type: 'Conv', time_ms: 0.3, share: 0.6 }, { name: 'fc', op_type: 'Gemm', time_ms: 0.2, share: 0.4 }],
    },
  } as unknown as ReportVariant;
}

describe('per-operator caption', () => {
  it('says what the numbers are and why they can exceed the p50', () => {
    const caption = profileCaption(variant(0.3, [0.3, 0.2]));
    expect(caption).toContain('the mean per run of a separate profiled session');
    expect(caption).toContain("Together 0.5 ms, more than the benchmark's p50 of 0.3 ms: the profiler's own overhead");
    expect(profileCaption(variant(1, [0.3, 0.2]))).toContain('Together 0.5 ms (benchmark p50 1 ms).');
  });

  it('lists the slowest layers beside their quantization sensitivity', () => {
    render(<LayerTable variant={variant(1, [0.5])} sensitivity={[{ node: 'fc', op_type: 'Gemm', sqnr_db: 12.34 }]} />);
    const rows = within(screen.getByTestId('layer-table')).getAllByRole('row').slice(1);
    expect(rows.map((row) => within(row).getAllByRole('cell').map((cell) => cell.textContent))).toEqual([
      ['conv1', 'Conv', '0.3 ms', '60%', '—'],
      ['fc', 'Gemm', '0.2 ms', '40%', '12.3'],
    ]);
  });
});
