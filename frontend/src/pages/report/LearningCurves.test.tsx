import { render, screen } from '@testing-library/react';
import { describe, expect, it } from 'vitest';

import type { ReportVariant } from '../../api/types';
import { LearningCurves, learnedSummary } from './LearningCurves';

function variant(key: string, recipe: Record<string, unknown> | null): ReportVariant {
  return { id: key.length, key, backend: 'onnxruntime', precision: 'int8', recipe, latency_ms: null, throughput_per_s: null,
    peak_memory_mb: null, size_bytes: null, accuracy: null, artifact: null, pareto: false } as unknown as ReportVariant;
}

describe('LearningCurves', () => {
  it('draws one curve per learned variant with its method and time', () => {
    const learned = variant('int8-mse-adaround', { learned: { method: 'adaround', seconds: 30.4, samples: 128, curve: [1, 0.5, 0.2] } });
    render(<LearningCurves variants={[variant('int8-mse', { method: 'mse' }), learned, learned]} />);
    expect(screen.getAllByRole('img')).toHaveLength(1);
    expect(screen.getByText(/int8-mse-adaround: adaround, 30.4 s on 128 samples; loss 1.00 → 0.200/)).toBeInTheDocument();
  });

  it('shows nothing when no variant learned', () => {
    const { container } = render(<LearningCurves variants={[variant('fp32', null)]} />);
    expect(container).toBeEmptyDOMElement();
    expect(learnedSummary(variant('int8', { learned: { curve: [] } }))).toBeNull();
  });
});
