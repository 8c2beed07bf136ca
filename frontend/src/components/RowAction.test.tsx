import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { describe, expect, it, vi } from 'vitest';
import { RevokeAction, RowAction } from './RowAction';

describe('RowAction', () => {
  it('is named for its row and acts only once the user confirms the question', async () => {
    const onConfirm = vi.fn();
    const confirm = vi.spyOn(window, 'confirm').mockReturnValueOnce(false).mockReturnValueOnce(true);
    render(
      <RowAction label="Revoke token ci" question="Revoke ci? Scripts using it stop working at once." onConfirm={onConfirm}>
        Revoke
      </RowAction>,
    );
    const button = screen.getByRole('button', { name: 'Revoke token ci' });
    expect(button).toHaveTextContent('Revoke');
    expect(button).toHaveAttribute('type', 'button');

    await userEvent.click(button);
    expect(confirm).toHaveBeenLastCalledWith('Revoke ci? Scripts using it stop working at once.');
    expect(onConfirm).not.toHaveBeenCalled();

    await userEvent.click(button);
    expect(onConfirm).toHaveBeenCalledTimes(1);
  });

  it('acts at once without a question, and not at all while disabled', async () => {
    const onConfirm = vi.fn();
    const confirm = vi.spyOn(window, 'confirm');
    const { rerender } = render(
      <RowAction label="Revoke registration token lab" onConfirm={onConfirm}>
        Revoke
      </RowAction>,
    );
    await userEvent.click(screen.getByRole('button', { name: 'Revoke registration token lab' }));
    expect(onConfirm).toHaveBeenCalledTimes(1);
    expect(confirm).not.toHaveBeenCalled();

    rerender(
      <RowAction label="Revoke registration token lab" onConfirm={onConfirm} disabled>
        Revoke
      </RowAction>,
    );
    const button = screen.getByRole('button', { name: 'Revoke registration token lab' });
    expect(button).toBeDisabled();
    await userEvent.click(button);
    expect(onConfirm).toHaveBeenCalledTimes(1);
  });

  it('offers Revoke, confirmed, until the row is revoked, then nothing', async () => {
    const onConfirm = vi.fn();
    vi.spyOn(window, 'confirm').mockReturnValue(true);
    const { rerender } = render(
      <RevokeAction revoked={false} label="Revoke agent box" question="Revoke box?" onConfirm={onConfirm} />,
    );
    const button = screen.getByRole('button', { name: 'Revoke agent box' });
    expect(button).toHaveTextContent('Revoke');
    await userEvent.click(button);
    expect(window.confirm).toHaveBeenCalledWith('Revoke box?');
    expect(onConfirm).toHaveBeenCalledTimes(1);

    rerender(<RevokeAction revoked label="Revoke agent box" question="Revoke box?" onConfirm={onConfirm} />);
    expect(screen.queryByRole('button')).toBeNull();
  });
});
