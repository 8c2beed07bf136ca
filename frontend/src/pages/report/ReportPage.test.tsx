import { partial } from '../../test/partial';
import { render, screen, within } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import type { Report } from '../../api/types';
import { toleranceText } from '../../components/tolerance';
import { Fp32Noise, OutputsJudged, Recommendation, SearchSummary } from './ReportPage';

function report(rounds: number, excluded: string[]): Report {
  return partial<Report>({
    job: 1,
    status: 'succeeded',
    tolerance: { metric: 'cosine', max_drop: 0.001 },
    search: {
      rounds,
      sensitivity: [
        { node: 'sensitive', op_type: 'MatMul', sqnr_db: 0.4 },
        { node: 'layer0', op_type: 'MatMul', sqnr_db: 39.6 },
      ],
    },
    devices: [
      {
        agent: { id: 1, name: 'box' },
        recommended: 7,
        reason: 'fastest within tolerance',
        variants: [
          {
            id: 7, key: 'int8-mse-keep1', round: 2, options: { nodes_to_exclude: excluded }, backend: 'onnxruntime', precision: 'int8',
            recipe: {}, latency_ms: null, throughput_per_s: null, peak_memory_mb: null, size_bytes: null,
            accuracy: { value: null, within_tolerance: false }, artifact: null, pareto: true,
          },
        ],
      },
    ],
  });
}

describe('SearchSummary', () => {
  it('lists the most sensitive nodes and marks those the recommendation keeps in float', () => {
    render(<SearchSummary report={report(2, ['sensitive'])} />);
    expect(screen.getByText(/2 rounds of candidates/)).toBeInTheDocument();
    const rows = within(screen.getByTestId('sensitivity-table')).getAllByRole('row').slice(1);
    expect(rows.map((row) => within(row).getAllByRole('cell')[0].textContent)).toEqual(['sensitive', 'layer0']);
    expect(within(rows[0]).getByText('kept in float')).toBeInTheDocument();
    expect(within(rows[1]).getByText('quantized')).toBeInTheDocument();
  });

  it('renders nothing for a plain job without a search', () => {
    const plain = partial<Report>({ ...report(1, []), search: { auto: false, rounds: 1, sensitivity: [] } });
    const { container } = render(<SearchSummary report={plain} />);
    expect(container).toBeEmptyDOMElement();
  });

  it('is filled for an auto search without ranked layers: the rounds, what each tried, why families were dropped, why no ranking', () => {
    const auto = partial<Report>({
      ...report(4, []),
      search: {
        auto: true, rounds: 4, sensitivity: [], budget_minutes: 30, stopped: null,
        sensitivity_note: 'INT8 was tried and did not pay on this device (not faster than FP32 beyond noise), so no layers were ranked.',
        tried: [
          { round: 1, variants: [{ key: 'fp32', effective_precision: 'fp32', backends: [], status: 'ready', error: '' },
                                 { key: 'int8-minmax', effective_precision: 'int8', backends: [], status: 'ready', error: '' },
                                 { key: 'int8-nncf', effective_precision: 'int8', backends: [], status: 'failed', error: 'memory budget' }] },
          { round: 2, variants: [{ key: 'bf16', effective_precision: 'bf16', backends: ['openvino'], status: 'ready', error: '' }] },
        ],
        notes: { 'agent:1': ['INT8 does not pay on this device: 0.89x the best FP32 (onnxruntime), within noise or slower; not calibrated further'] },
      },
    });
    render(<SearchSummary report={auto} />);
    expect(screen.getByText(/4 rounds of candidates/)).toBeInTheDocument();
    const rounds = within(screen.getByTestId('search-rounds')).getAllByRole('listitem');
    expect(rounds[0]).toHaveTextContent('Round 1: fp32, int8-minmax, int8-nncf (build failed)');
    expect(rounds[1]).toHaveTextContent('Round 2: bf16');
    expect(screen.getByTestId('search-notes')).toHaveTextContent('INT8 does not pay on this device');
    expect(screen.getByTestId('sensitivity-note')).toHaveTextContent('INT8 was tried and did not pay');
  });
});

describe('Recommendation', () => {
  it('says "best so far" while the job still measures', () => {
    const device = { ...report(1, []).devices[0], final: false };
    render(<Recommendation device={device} />);
    expect(screen.getByText('Best so far')).toBeInTheDocument();
    expect(screen.queryByText('Recommended')).not.toBeInTheDocument();
  });
});

describe('toleranceText', () => {
  it('says a floor for SQNR and a drop for the other metrics', () => {
    expect(toleranceText({ metric: 'sqnr', min_value: 28 })).toBe('SQNR at least 28 dB');
    expect(toleranceText({ metric: 'cosine', max_drop: 0.001 })).toBe('cosine may drop by at most 0.1%');
  });
});


describe('accuracy context', () => {
  it("shows how each output is judged and FP32's noise on each backend", () => {
    const base = report(1, []);
    render(
      <>
        <OutputsJudged
          report={{ ...base, evaluation: { outputs: [{ name: 'maps', kind: 'probability_map', primary: true }, { name: 'aux', kind: 'dense', primary: false }] } }}
        />
        <Fp32Noise
          device={{
            ...base.devices[0],
            fp32_noise: [
              { backend: 'onnxruntime', metric: 'mask_iou', output: 'maps', value: 1, drop: 0, sqnr_db: null, within_tolerance: true },
              { backend: 'openvino', metric: 'mask_iou', output: 'maps', value: 0.9996, drop: 0.0004, sqnr_db: null, within_tolerance: true },
            ],
          }}
        />
      </>,
    );
    expect(screen.getByTestId('outputs-judged').textContent).toBe('Judged by: maps as Probability map (primary); aux as Dense map');
    const noise = screen.getByTestId('fp32-noise').textContent ?? '';
    expect(noise).toContain('onnxruntime mask_iou 1.0000 (no drop)');
    expect(noise).toContain('openvino mask_iou 0.9996 (drop 4.0e-4)');
  });
});
