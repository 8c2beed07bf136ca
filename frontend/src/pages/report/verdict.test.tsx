import { fireEvent, render, screen, within } from '@testing-library/react';
import { describe, expect, it, vi } from 'vitest';
import type { ReportDevice, ReportVariant, Verdict } from '../../api/types';
import { Recommendation } from './ReportPage';
import { costPhrase, speedupPhrase, tieBadge, tiePhrase } from './verdict';

function variant(id: number, precision: string, p50: number): ReportVariant {
  return {
    id, key: precision, backend: 'onnxruntime', precision, recipe: null, latency_ms: { p50, p90: p50, p99: p50, mean: p50, std: 0 },
    throughput_per_s: null, peak_memory_mb: null, size_bytes: null, accuracy: null, artifact: null, pareto: true,
  } as ReportVariant;
}

const steady: Verdict = {
  variant: 2, label: 'int8-mse on onnxruntime', tie: false, tied_with: [],
  text: 'Use int8-mse on onnxruntime: 2.41x faster than FP32 (0.41 vs 0.98 ms); costs 0.0031 top1_agreement (0.9969).',
  speedup: { baseline: 1, ratio: 2.41, low: 2.3, high: 2.5, source: 'benchmark windows', beyond_noise: true },
  accuracy: { metric: 'top1_agreement', value: 0.9969, drop: 0.0031 },
};

const tie: Verdict = {
  variant: 1, label: 'fp32 on onnxruntime', tie: true, speedup: null,
  text: 'Use fp32 on onnxruntime: the FP32 reference itself; int4-weight on onnxruntime measured 1.10x (0.97x to 1.24x) faster, a tie within noise, so the more accurate one is recommended; no accuracy cost (top1_agreement 1).',
  tied_with: [{ variant: 2, label: 'int4-weight on onnxruntime', ratio: 1.0952, low: 0.971, high: 1.235, source: 'benchmark windows', beyond_noise: false, too_noisy: false }],
  accuracy: { metric: 'top1_agreement', value: 1, drop: 0 },
};

function device(verdict: Verdict, extra: Partial<ReportDevice> = {}): ReportDevice {
  return {
    agent: { id: 1, name: 'box' }, recommended: verdict.variant, reason: verdict.text, final: true, verdict,
    variants: [variant(1, 'fp32', 0.023), variant(2, 'int8', 0.021)], ...extra,
  };
}

describe('recommendation wording', () => {
  it('names the speed-up over FP32 and the accuracy cost', () => {
    expect(speedupPhrase(steady)).toBe('2.41x faster than FP32');
    expect(costPhrase(steady)).toBe('costs 0.0031 top1_agreement');
    expect(tiePhrase(steady)).toBeNull();
  });

  it('calls a speed-up inside the noise a tie and shows its interval', () => {
    const inside: Verdict = { ...steady, speedup: { baseline: 1, ratio: 1.1, low: 0.95, high: 1.27, source: 'benchmark windows', beyond_noise: false } };
    expect(speedupPhrase(inside)).toBe("1.10x (0.95x–1.27x) FP32's speed: a tie within noise");
    expect(tiePhrase(tie)).toBe(
      'A tie within noise: int4-weight on onnxruntime measured 1.10x (0.97x–1.24x) faster, which the measured noise does not rule out being no faster at all.',
    );
    expect(speedupPhrase(tie)).toBe('FP32 itself');
    expect(costPhrase(tie)).toBe('no accuracy cost');
  });

  it('calls a gap with a very wide interval too noisy to tell, in the words of the server, not a tie', () => {
    const noisy: Verdict = {
      ...tie,
      text: 'Use fp32 on onnxruntime: the FP32 reference itself; int4-weight on onnxruntime measured 1.10x faster, so the more accurate one is recommended, but too noisy to tell: 0.82x to 1.46x; re-run on a quieter device; no accuracy cost (top1_agreement 1).',
      tied_with: [{ ...tie.tied_with[0], low: 0.823, high: 1.458, too_noisy: true }],
    };
    const phrase = tiePhrase(noisy);
    expect(phrase).toBe('int4-weight on onnxruntime measured 1.10x faster, but too noisy to tell: 0.82x to 1.46x; re-run on a quieter device.');
    expect(phrase).not.toContain('tie');
    // The same clause as the server's verdict line (workers/scoring.py).
    expect(noisy.text).toContain('too noisy to tell: 0.82x to 1.46x; re-run on a quieter device');
    expect(tieBadge(noisy)).toBe('Too noisy to tell');
    expect(tieBadge(tie)).toBe('Tie within noise');
    expect(tieBadge(steady)).toBeNull();
    const wide: Verdict = { ...steady, speedup: { baseline: 1, ratio: 1.0952, low: 0.823, high: 1.458, source: 'benchmark windows', beyond_noise: false, too_noisy: true } };
    expect(speedupPhrase(wide)).toBe("1.10x FP32's speed: too noisy to tell: 0.82x to 1.46x; re-run on a quieter device");
    render(<Recommendation device={device(noisy)} />);
    expect(screen.getByText('Too noisy to tell')).toBeInTheDocument();
    expect(screen.queryByText('Tie within noise')).not.toBeInTheDocument();
  });

  it('renders one verdict line, a badge for the tie, and the why-not table by family', () => {
    render(
      <Recommendation
        device={device(tie, {
          alternatives: [
            { family: 'int4', variants: 1, variant: 2, label: 'int4-weight on onnxruntime', p50_ms: 0.021, drop: 0.001, metric: 'top1_agreement', why: 'a tie within noise, and less accurate' },
            { family: 'int8', variants: 3, variant: 3, label: 'int8-mse on onnxruntime', p50_ms: 0.03, drop: 0.002, metric: 'top1_agreement', why: "slower: 0.77x the recommended's speed" },
          ],
        })}
      />,
    );
    expect(screen.getAllByTestId('verdict')).toHaveLength(1);
    expect(screen.getByTestId('verdict')).toHaveTextContent(tie.text);
    expect(screen.getByText('Tie within noise')).toBeInTheDocument();
    const rows = within(screen.getByTestId('why-not')).getAllByRole('row').slice(1);
    expect(rows.map((row) => within(row).getByRole('rowheader').textContent)).toEqual(['int4', 'int8']);
    expect(within(rows[1]).getByText('(best of 3)')).toBeInTheDocument();
    expect(within(rows[1]).getByText("slower: 0.77x the recommended's speed")).toBeInTheDocument();
  });

  it('explains an unstable row in words with its spread and offers a re-measure', () => {
    const onRemeasure = vi.fn();
    const note = 'int4-weight on onnxruntime was unstable: its measurement windows gave 0.019, 0.021, 0.025 ms (a 29% spread around its p50 of 0.021 ms), so its speed is known only to about ±29%.';
    render(<Recommendation device={device(tie, { unstable: [{ variant: 2, label: 'int4-weight on onnxruntime', spread: 0.29, window_medians_ms: [0.019, 0.021, 0.025], text: note }] })} onRemeasure={onRemeasure} />);
    expect(screen.getByTestId('unstable-note')).toHaveTextContent(note);
    expect(screen.getByTestId('unstable-notes')).toHaveTextContent('disagree by more than 10%');
    fireEvent.click(screen.getByTestId('remeasure'));
    expect(onRemeasure).toHaveBeenCalledOnce();
  });

  it('falls back on the stored reason for reports without a verdict', () => {
    render(<Recommendation device={{ ...device(steady), verdict: null, reason: 'Fastest variant within tolerance.' }} />);
    expect(screen.getByTestId('verdict')).toHaveTextContent('Fastest variant within tolerance.');
    expect(screen.queryByTestId('why-not')).not.toBeInTheDocument();
  });
});
