import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { useState } from 'react';
import { describe, expect, it, vi } from 'vitest';
import { InlineForm, NameOptions, SelectField, TextField } from './FormFields';

function TokenForm({ onSubmit }: { onSubmit: (name: string, expiry: string) => void }) {
  const [name, setName] = useState('');
  const [expiry, setExpiry] = useState('30');
  return (
    <InlineForm label="Create API token" submitLabel="Create token" disabled={!name.trim()} onSubmit={() => onSubmit(name, expiry)}>
      <TextField label="Name" required value={name} placeholder="e.g. ci" onChange={(event) => setName(event.target.value)} data-testid="token-name" />
      <SelectField
        label="Expires after"
        value={expiry}
        onChange={(event) => setExpiry(event.target.value)}
        data-testid="token-expiry"
        after={<p>Chosen: {expiry}</p>}
      >
        <option value="30">30 days</option>
        <option value="never">Never</option>
      </SelectField>
    </InlineForm>
  );
}

describe('form fields', () => {
  it('ties each label to its control and passes the attributes given through', () => {
    render(<TokenForm onSubmit={vi.fn()} />);
    const name = screen.getByLabelText('Name');
    expect(name).toBe(screen.getByTestId('token-name'));
    expect(name).toBeRequired();
    expect(name).toHaveAttribute('placeholder', 'e.g. ci');
    expect(name.parentElement).toHaveClass('field');
    expect(screen.getByLabelText('Expires after')).toBe(screen.getByTestId('token-expiry'));
    // Two fields on one page get different ids.
    expect(name.id).not.toBe(screen.getByLabelText('Expires after').id);
    expect(screen.getByText('Chosen: 30').parentElement).toBe(screen.getByLabelText('Expires after').parentElement);
  });

  it('submits without reloading, with the values typed, only once the button is enabled', async () => {
    const onSubmit = vi.fn();
    render(<TokenForm onSubmit={onSubmit} />);
    const form = screen.getByRole('form', { name: 'Create API token' });
    const button = screen.getByRole('button', { name: 'Create token' });
    expect(button).toHaveAttribute('type', 'submit');
    expect(button).toBeDisabled();

    await userEvent.type(screen.getByLabelText('Name'), 'ci-pipeline');
    await userEvent.selectOptions(screen.getByLabelText('Expires after'), 'never');
    expect(screen.getByText('Chosen: never')).toBeInTheDocument();
    await userEvent.click(button);
    expect(onSubmit).toHaveBeenCalledWith('ci-pipeline', 'never');

    const event = new Event('submit', { bubbles: true, cancelable: true });
    form.dispatchEvent(event);
    expect(event.defaultPrevented).toBe(true);
  });

  it('takes a field class for inline fields', () => {
    render(<TextField label="Search" className="field field-inline" value="" onChange={vi.fn()} />);
    expect(screen.getByLabelText('Search').parentElement).toHaveClass('field', 'field-inline');
  });

  it('lists one option per name, valued and shown by the name', () => {
    render(
      <select aria-label="Output">
        <NameOptions items={[{ name: 'logits' }, { name: 'state' }]} />
      </select>,
    );
    const options = screen.getAllByRole('option');
    expect(options.map((option) => [option.getAttribute('value'), option.textContent])).toEqual([
      ['logits', 'logits'],
      ['state', 'state'],
    ]);
  });
});
