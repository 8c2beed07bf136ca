import { partial } from '../../test/partial';
import { fireEvent, render, screen, within } from '@testing-library/react';
import { describe, expect, it, vi } from 'vitest';
import type { Decision, Report, ReportDevice, ReportVariant } from '../../api/types';
import { ResultSummary } from '../JobPage';
import { Recommendation } from './ReportPage';
import { decisionOf, headline, tieBadge } from './verdict';
import { MemoryRouter } from 'react-router';

function variant(id: number, precision: string, p50: number): ReportVariant {
  return {
    id, key: precision, label: `${precision} on onnxruntime`, backend: 'onnxruntime', precision, recipe: {},
    latency_ms: { p50, p90: p50, p99: p50, mean: p50, std: 0 }, throughput_per_s: null, peak_memory_mb: null, size_bytes: null,
    accuracy: { value: null, within_tolerance: false }, artifact: null, pareto: true,
  } as ReportVariant;
}

const steady = partial<Decision>({
  variant: 2, label: 'int8 · int8-mse on onnxruntime', tie: false, tied_with: [], comparison: 'faster',
  text: 'Use int8 · int8-mse on onnxruntime: 2.41x faster than FP32 on onnxruntime (2.30x to 2.50x, 12 paired rounds); costs 0.0031 top1_agreement (0.9969).',
  speed: 'a server-chosen speed clause, shown as it is', short: '2.41x faster', cost: 'a server-chosen cost clause',
  speedup: { baseline: 1, ratio: 2.41, low: 2.3, high: 2.5, source: 'interleaved re-timing', comparison: 'faster', beyond_noise: true, rounds: 12 },
  accuracy: { metric: 'top1_agreement', value: 0.9969, drop: 0.0031 },
  noise: { text: '3 window(s) were re-taken because other processes kept the device busy (stress 97%).', retaken: 3, busy: 0 },
  measurement: {
    source: 'interleaved re-timing', rounds: 12, stopped: 'separated', stopped_text: 'stopped once the leader was faster than every rival at 95%',
    finalists: [
      { variant: 2, label: 'int8 · int8-mse on onnxruntime', p50_ms: 0.41, round_medians_ms: [] },
      { variant: 1, label: 'fp32 on onnxruntime', p50_ms: 0.98, round_medians_ms: [],
        against_recommended: { ratio: 2.41, low: 2.3, high: 2.5, source: 'interleaved re-timing', comparison: 'faster', beyond_noise: true, per_round: [2.4, 2.45, 2.38] } },
    ],
  },
  alternatives: [
    { family: 'fp32', variants: 1, variant: 1, label: 'fp32 on onnxruntime', p50_ms: 0.98, drop: 0, metric: 'top1_agreement', outcome: 'slower',
      why: 'slower: the recommended is 2.41x faster (2.30x to 2.50x, 12 paired rounds)' },
    { family: 'int8', variants: 1, variant: null, build: 40, label: 'int8 · int8-entropy on onnxruntime', p50_ms: null, drop: null, metric: null,
      outcome: 'build failed', why: 'never reached the device: the build ran out of memory: the int8 build used more than the build memory budget of 4096 MB' },
  ],
});

const tie = partial<Decision>({
  ...steady, variant: 1, label: 'fp32 on onnxruntime', tie: true, comparison: null, speedup: null, speed: 'it is the FP32 reference', short: 'FP32 itself',
  text: 'Use fp32 on onnxruntime: it is the FP32 reference; int4 weights · int4-rtn on onnxruntime measured 1.10x faster (0.97x to 1.24x), a tie, and fp32 on onnxruntime is recommended because it is more accurate (top1_agreement drop 0 against 0.001); no accuracy cost (top1_agreement 1).',
  tied_with: [{ variant: 2, label: 'int4 weights · int4-rtn on onnxruntime', ratio: 1.0952, low: 0.971, high: 1.235, source: 'benchmark windows', comparison: 'tie', beyond_noise: false }],
});

function device(decision: Decision, extra: Partial<ReportDevice> = {}): ReportDevice {
  return partial<ReportDevice>({
    agent: { id: 1, name: 'box' }, recommended: decision.variant, reason: decision.text, final: true, decision,
    variants: [variant(1, 'fp32', 0.98), variant(2, 'int8', 0.41)], ...extra,
  });
}

describe('the decision, rendered', () => {
  it('shows the server\'s own clauses, never its own wording', () => {
    render(<Recommendation device={device(steady)} />);
    expect(screen.getByTestId('recommended-label')).toHaveTextContent('int8 · int8-mse on onnxruntime');
    expect(screen.getByTestId('verdict-speedup')).toHaveTextContent('a server-chosen speed clause, shown as it is');
    expect(screen.getByTestId('verdict-cost')).toHaveTextContent('a server-chosen cost clause');
    expect(screen.getAllByTestId('verdict')).toHaveLength(1);
    expect(screen.getByTestId('verdict')).toHaveTextContent(steady.text);
    expect(tieBadge(steady)).toBeNull();
  });

  it('tells the noise once, shows the side-by-side rounds, and lists failed builds in why not the others', () => {
    render(<Recommendation device={device(steady)} />);
    expect(screen.getAllByTestId('noise-note')).toHaveLength(1);
    expect(screen.getByTestId('noise-note')).toHaveTextContent('3 window(s) were re-taken because other processes kept the device busy');
    expect(screen.getByTestId('side-by-side')).toHaveTextContent('2 finalists, 12 rounds (stopped once the leader was faster than every rival at 95%)');
    const rows = screen.getAllByTestId('side-by-side-row');
    expect(within(rows[1]).getByText('2.41x (2.30x to 2.50x): faster')).toBeInTheDocument();
    expect(within(rows[1]).getByText('2.40 · 2.45 · 2.38')).toBeInTheDocument();
    const whyNot = within(screen.getByTestId('why-not')).getAllByRole('row').slice(1);
    expect(whyNot.map((row) => row.getAttribute('data-outcome'))).toEqual(['slower', 'build failed']);
    expect(within(whyNot[1]).getByText(/ran out of memory/)).toBeInTheDocument();
  });

  it('badges a tie and offers a re-measure only where the noise left something unsettled', () => {
    const onRemeasure = vi.fn();
    const unsettled: Decision = { ...tie, measurement: null, noise: { text: '2 of 2 first-pass benchmarks on this device were unstable.', unstable: 2, busy: 0 } };
    render(<Recommendation device={device(unsettled)} onRemeasure={onRemeasure} />);
    expect(screen.getByText('Tie within noise')).toBeInTheDocument();
    fireEvent.click(screen.getByTestId('remeasure'));
    expect(onRemeasure).toHaveBeenCalledOnce();
  });

  it('badges a decision taken on busy rounds as provisional, with the server\'s words', () => {
    const words = 'provisional: the device was busy in 6 of the 6 side-by-side rounds the decision rests on (burner 95%)';
    const busy: Decision = { ...steady, text: `${steady.text.slice(0, -1)}; ${words}.`,
      provisional: { busy: 6, windows: 6, attempts: 1, busiest: ['burner 95%'], text: words } };
    render(<Recommendation device={device(busy)} />);
    expect(screen.getByTestId('provisional-badge')).toHaveTextContent('Provisional: the device was busy');
    expect(screen.getByTestId('provisional-badge')).toHaveAttribute('title', words);
    expect(screen.getByTestId('verdict')).toHaveTextContent(words);
  });

  it('prints a side-by-side ratio as the server wrote it, with the digits that decide it', () => {
    const close = partial<Decision>({ ...steady, measurement: { ...steady.measurement!, finalists: [steady.measurement!.finalists[0], {
      ...steady.measurement!.finalists[1],
      against_recommended: { ratio: 1.0256, low: 1.0019, high: 1.0498, source: 'interleaved re-timing', comparison: 'faster', beyond_noise: true,
        per_round: [1.02, 1.03], ratio_text: '1.03x', interval_text: '1.002x to 1.05x' } }] } });
    render(<Recommendation device={device(close)} />);
    expect(within(screen.getAllByTestId('side-by-side-row')[1]).getByText('1.03x (1.002x to 1.05x): faster')).toBeInTheDocument();
  });

  it('shows no provisional badge on a quiet decision', () => {
    render(<Recommendation device={device(steady)} />);
    expect(screen.queryByTestId('provisional-badge')).not.toBeInTheDocument();
  });

  it('the job page\'s Result card renders the same decision', () => {
    render(<MemoryRouter><ResultSummary report={partial<Report>({ job: 1, status: 'succeeded', tolerance: { metric: 'auto', max_drop: 0.01 }, devices: [device(steady)] })} jobId={1} /></MemoryRouter>);
    expect(screen.getByTestId('result-device')).toHaveTextContent('int8 · int8-mse on onnxruntime');
    expect(screen.getByTestId('result-speedup')).toHaveTextContent(steady.speed as string);
    expect(screen.getByTestId('result-device')).toHaveTextContent(steady.text);
  });

  it('reads the decision under its one name; without one, the reason', () => {
    expect(decisionOf(device(steady))).toBe(steady);
    render(<Recommendation device={{ ...device(steady), decision: null, reason: 'Fastest variant within tolerance.' }} />);
    expect(screen.getByTestId('verdict')).toHaveTextContent('Fastest variant within tolerance.');
    expect(screen.queryByTestId('why-not')).not.toBeInTheDocument();
    expect(headline({ ...device(steady), decision: null, reason: '' })).toBe('');
  });
});
