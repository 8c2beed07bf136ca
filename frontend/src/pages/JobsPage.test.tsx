import { screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { json, renderRoutes } from '../test/render';
import { JobsPage } from './JobsPage';

function job(id: number) {
  return { id, status: 'succeeded', stage: 'done', progress: 1, error: null, model_version: 1, model: { id: 1, name: `model-${id}` },
    precisions: ['fp32'], targets: [], tolerance: { metric: 'auto', max_drop: 0.01 }, calibration_dataset: null, validation_dataset: null,
    created_at: '2026-01-01T00:00:00Z', finished_at: null, rerun_of: id === 120 ? 7 : null };
}

describe('JobsPage pagination', () => {
  const fetchMock = vi.fn<typeof fetch>();
  beforeEach(() => {
    vi.stubGlobal('fetch', fetchMock);
    fetchMock.mockReset();
    fetchMock.mockImplementation(async (input) => {
      const url = new URL(String(input), 'http://x');
      const page = Number(url.searchParams.get('page') ?? 1);
      const first = 120 - (page - 1) * 50;
      const ids = Array.from({ length: Math.min(50, first) }, (_, index) => first - index);
      return json({ count: 120, next: page < 3 ? 'more' : null, previous: page > 1 ? 'less' : null, results: ids.map(job) });
    });
  });
  afterEach(() => vi.unstubAllGlobals());

  it('pages through the list with previous and next', { timeout: 30_000 }, async () => {
    renderRoutes([{ path: '/deployments', element: <JobsPage /> }], '/deployments');
    expect(await screen.findByText('1–50 of 120 · page 1 of 3', {}, { timeout: 10_000 })).toBeInTheDocument();
    expect(screen.getByText('re-run of #7')).toBeInTheDocument();
    expect(screen.getByRole('button', { name: 'Previous' })).toBeDisabled();
    await userEvent.click(screen.getByRole('button', { name: 'Next' }));
    expect(await screen.findByText('51–100 of 120 · page 2 of 3', {}, { timeout: 10_000 })).toBeInTheDocument();
    expect(screen.getByText('#70')).toBeInTheDocument();
    await userEvent.click(screen.getByRole('button', { name: 'Next' }));
    expect(await screen.findByText('101–120 of 120 · page 3 of 3', {}, { timeout: 10_000 })).toBeInTheDocument();
    expect(screen.getByRole('button', { name: 'Next' })).toBeDisabled();
    expect(fetchMock.mock.calls.map(([url]) => String(url))).toContain('/api/v1/jobs/?page=3');
  });
});
