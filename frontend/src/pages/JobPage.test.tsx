import { partial } from '../test/partial';
import { render, screen } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import type { Job, JobVariant } from '../api/types';
import { durationText, precisionText, runsOn, SearchBudgetLine, VariantList, WaitingLine } from './JobPage';

function job(budget: Job['budget']): Job {
  return partial<Job>({ id: 1, status: 'running', stage: 'devices', progress: 0.5, error: '', model_version: 1, model: { id: 1, name: 'm' },
    precisions: ['auto'], targets: [], tolerance: { metric: 'auto', max_drop: 0.01 }, calibration_dataset: null, validation_dataset: null,
    created_at: '2026-01-01T00:00:00Z', finished_at: null, budget });
}

describe('SearchBudgetLine', () => {
  it('shows the minutes left while the search runs', () => {
    render(<SearchBudgetLine job={job({ minutes: 30, started_at: 1, seconds_left: 601, stopped: null })} />);
    expect(screen.getByTestId('search-budget')).toHaveTextContent('Search budget 30 min of work · 11 min left');
  });

  it('counts work, and says a first answer is in while the search refines it', () => {
    render(<SearchBudgetLine job={job({ minutes: 10, started_at: 1, work_seconds: 192, seconds_left: 408, first_answer_at: 5, stopped: null })} />);
    expect(screen.getByTestId('search-budget')).toHaveTextContent('Search budget 10 min of work · 3.2 min used · 7 min left · first answer; still searching');
  });

  it('says why the search stopped when the budget ended it', () => {
    render(<SearchBudgetLine job={job({ minutes: 2, started_at: 1, seconds_left: 0, stopped: 'the time budget of 2 minute(s) was spent' })} />);
    expect(screen.getByTestId('search-budget')).toHaveTextContent('stopped: the time budget of 2 minute(s) was spent');
  });

  it('shows nothing for explicit precisions', () => {
    const { container } = render(<SearchBudgetLine job={job({})} />);
    expect(container).toBeEmptyDOMElement();
  });
});

describe('stage durations', () => {
  it('add up every search round, not only the last', () => {
    const stage = { name: 'quantize', status: 'done', started_at: '2026-01-01T00:01:00Z', finished_at: '2026-01-01T00:01:05Z', message: null, seconds: 95, runs: 3 } as const;
    expect(durationText(stage)).toBe('1 min 35 s over 3 rounds');
    expect(durationText({ ...stage, seconds: undefined, runs: undefined })).toBe('5.0 s');
  });
});

describe('WaitingLine', () => {
  it('says why the job waits and for how long', () => {
    const waiting = { cause: 'build_slot', position: 2, since: '2026-01-01T00:00:00Z', message: 'waiting for a build slot: 2 jobs ahead (5 builds)' } as const;
    render(<WaitingLine job={{ ...job({}), waiting }} now={Date.parse('2026-01-01T00:01:30Z')} />);
    expect(screen.getByTestId('job-waiting')).toHaveTextContent('Waiting for a build slot: 2 jobs ahead (5 builds) (for 1 min 30 s)');
  });

  it('shows nothing while the job works', () => {
    const { container } = render(<WaitingLine job={{ ...job({}), waiting: null }} />);
    expect(container).toBeEmptyDOMElement();
  });
});

function variant(patch: Partial<JobVariant>): JobVariant {
  return partial<JobVariant>({ id: 1, key: 'fp32', precision: 'fp32', backends: [], recipe: {}, status: 'ready', error: '', size_bytes: null, sha256: null, ...patch });
}

describe('the Variants table', () => {
  it('names what a variant computes in: bf16 for an FP32 build under the bf16 hint', () => {
    const bf16 = variant({ key: 'bf16', precision: 'fp32', effective_precision: 'bf16', backends: ['openvino'] });
    expect(precisionText(bf16)).toEqual({ effective: 'bf16', stored: 'fp32 build' });
    expect(precisionText(variant({ key: 'int8-minmax', precision: 'int8', effective_precision: 'int8' }))).toEqual({ effective: 'int8', stored: null });
    render(<VariantList variants={[bf16]} />);
    expect(screen.getByTestId('variant-precision')).toHaveTextContent('bf16fp32 build');
  });

  it('says why a variant runs nowhere instead of a bare dash', () => {
    expect(runsOn(variant({ key: 'int4-rtn', status: 'skipped', error: 'int4-weight needs MatMul weights; this model has none' }))).toEqual({
      runtimes: 'none: not built', why: 'int4-weight needs MatMul weights; this model has none' });
    expect(runsOn(variant({ status: 'building' })).runtimes).toBe('decided when built');
    expect(runsOn(variant({ recipe: { refused_backends: { openvino: 'MatMulNBits is not supported' } } }))).toEqual({
      runtimes: 'none', why: 'not on openvino: MatMulNBits is not supported' });
    expect(runsOn(variant({ backends: ['onnxruntime'], recipe: { refused_backends: { openvino: 'no MatMulNBits' } } }))).toEqual({
      runtimes: 'onnxruntime', why: 'not on openvino: no MatMulNBits' });
  });
});
