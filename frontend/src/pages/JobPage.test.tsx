import { render, screen } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import type { Job } from '../api/types';
import { SearchBudgetLine } from './JobPage';

function job(budget: Job['budget']): Job {
  return { id: 1, status: 'running', stage: 'devices', progress: 0.5, error: null, model_version: 1, model: { id: 1, name: 'm' },
    precisions: ['auto'], targets: [], tolerance: { metric: 'auto', max_drop: 0.01 }, calibration_dataset: null, validation_dataset: null,
    created_at: '2026-01-01T00:00:00Z', finished_at: null, budget } as Job;
}

describe('SearchBudgetLine', () => {
  it('shows the minutes left while the search runs', () => {
    render(<SearchBudgetLine job={job({ minutes: 30, started_at: 1, seconds_left: 601, stopped: null })} />);
    expect(screen.getByTestId('search-budget')).toHaveTextContent('Search budget 30 min · 11 min left');
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
