import { render, screen } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import { ListStates } from './ListStates';

function renderStates(props: { pending: boolean; empty: boolean; error?: unknown }) {
  return render(
    <ListStates {...props} whenEmpty={<p>Nothing yet.</p>}>
      <table data-testid="the-list" />
    </ListStates>,
  );
}

describe('ListStates', () => {
  it('shows loading while pending, not the empty text or the list', () => {
    renderStates({ pending: true, empty: true });
    expect(screen.getByRole('status')).toHaveTextContent('Loading');
    expect(screen.queryByText('Nothing yet.')).toBeNull();
    expect(screen.queryByTestId('the-list')).toBeNull();
  });

  it('shows the empty text for an empty list and the list otherwise', () => {
    const { rerender } = renderStates({ pending: false, empty: true });
    expect(screen.getByText('Nothing yet.')).toBeInTheDocument();
    expect(screen.queryByTestId('the-list')).toBeNull();
    expect(screen.queryByRole('status')).toBeNull();

    rerender(
      <ListStates pending={false} empty={false} whenEmpty={<p>Nothing yet.</p>}>
        <table data-testid="the-list" />
      </ListStates>,
    );
    expect(screen.getByTestId('the-list')).toBeInTheDocument();
    expect(screen.queryByText('Nothing yet.')).toBeNull();
  });

  it('shows an error above the list', () => {
    render(
      <ListStates error={new Error('Revoking failed.')} pending={false} empty={false}>
        <table data-testid="the-list" />
      </ListStates>,
    );
    expect(screen.getByRole('alert')).toHaveTextContent('Revoking failed.');
    expect(screen.getByTestId('the-list')).toBeInTheDocument();
  });

  it('shows nothing for an empty list without empty text', () => {
    const { container } = render(
      <ListStates pending={false} empty>
        <table data-testid="the-list" />
      </ListStates>,
    );
    expect(container).toBeEmptyDOMElement();
  });
});
