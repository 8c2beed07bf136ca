import { render, screen, within } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import { DataTable } from './DataTable';

describe('DataTable', () => {
  it('heads each column, names the actions column for screen readers only, and holds the rows', () => {
    render(
      <DataTable
        columns={['Name', { label: 'Speed-up', className: 'numeric', title: 'vs FP32' }]}
        actions
        testId="things-table"
        caption="Things"
        footer={<nav aria-label="Things pages" />}
      >
        <tr data-testid="thing-row">
          <td>first</td>
          <td>2.0x</td>
          <td>
            <button type="button">Delete</button>
          </td>
        </tr>
      </DataTable>,
    );
    const table = screen.getByTestId('things-table');
    expect(screen.getByRole('table', { name: 'Things' })).toBe(table);
    const headers = within(table).getAllByRole('columnheader');
    expect(headers.map((header) => header.textContent)).toEqual(['Name', 'Speed-up', 'Actions']);
    expect(headers[1]).toHaveClass('numeric');
    expect(headers[1]).toHaveAttribute('title', 'vs FP32');
    expect(within(headers[2]).getByText('Actions')).toHaveClass('visually-hidden');
    expect(within(table).getByTestId('thing-row')).toHaveTextContent('first');
    // The footer (a pager) scrolls with the table, outside it.
    expect(table.parentElement).toHaveClass('table-wrap');
    expect(within(table.parentElement!).getByRole('navigation', { name: 'Things pages' })).toBeInTheDocument();
    expect(within(table).queryByRole('navigation')).toBeNull();
  });

  it('has no actions header unless asked, and takes the table and wrapper classes given', () => {
    render(
      <DataTable columns={['Job']} className="table table-compact" wrapClassName="card table-wrap" testId="jobs">
        <tr>
          <td>#1</td>
        </tr>
      </DataTable>,
    );
    const table = screen.getByTestId('jobs');
    expect(within(table).getAllByRole('columnheader').map((header) => header.textContent)).toEqual(['Job']);
    expect(table).toHaveClass('table', 'table-compact');
    expect(table.parentElement).toHaveClass('card', 'table-wrap');
    expect(table.querySelector('caption')).toBeNull();
  });
});
