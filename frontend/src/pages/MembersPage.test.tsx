import { screen, waitFor, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { Member, Role } from '../api/types';
import { json, meResponse, renderRoutes } from '../test/render';
import { MembersPage } from './MembersPage';

const members: Member[] = [
  { id: 1, user: 1, username: 'ada', role: 'owner', created_at: '2026-01-01T00:00:00Z' },
  { id: 2, user: 2, username: 'grace', role: 'member', created_at: '2026-02-01T00:00:00Z' },
];

describe('MembersPage', () => {
  const fetchMock = vi.fn<typeof fetch>();
  let role: Role = 'owner';

  beforeEach(() => {
    role = 'owner';
    document.cookie = 'csrftoken=tok; path=/';
    vi.stubGlobal('fetch', fetchMock);
    fetchMock.mockReset();
    fetchMock.mockImplementation(async (input, init) => {
      const url = String(input);
      const method = init?.method ?? 'GET';
      if (url === '/api/v1/auth/me/') return meResponse(role);
      if (url === '/api/v1/members/' && method === 'GET') return json(members);
      if (url === '/api/v1/members/' && method === 'POST') {
        return json({ error: 'No user has that name; they sign up first, then you add them.', code: 'unknown_user' }, 400);
      }
      if (url === '/api/v1/members/1/' && method === 'PATCH') {
        return json({ error: 'An organization keeps at least one owner.', code: 'last_owner' }, 409);
      }
      if (url === '/api/v1/members/2/' && method === 'DELETE') return json(null, 204);
      return json({ error: 'not found' }, 404);
    });
  });
  afterEach(() => vi.unstubAllGlobals());

  function renderPage() {
    renderRoutes([{ path: '/members', element: <MembersPage /> }], '/members');
  }

  const calls = (method: string) => fetchMock.mock.calls.filter(([, init]) => (init?.method ?? 'GET') === method);

  it('lists the members with their role and lets an owner add, change and remove', async () => {
    renderPage();
    const rowsShown = await screen.findAllByTestId('member-row');
    expect(rowsShown).toHaveLength(2);
    expect(rowsShown[1]).toHaveTextContent('grace');
    expect(await screen.findByRole('form', { name: 'Add member' })).toBeInTheDocument();
    expect(screen.getByLabelText('Username')).toBeInTheDocument();
    expect(screen.getByLabelText('Role')).toHaveValue('member');
    expect(screen.getByLabelText('Role of grace')).toHaveValue('member');
    expect(screen.getByRole('button', { name: 'Remove grace' })).toBeInTheDocument();
    expect(screen.getByRole('button', { name: 'Leave Acme' })).toBeInTheDocument();
    expect(screen.queryByTestId('members-read-only')).not.toBeInTheDocument();

    const confirm = vi.spyOn(window, 'confirm').mockReturnValue(true);
    await userEvent.click(screen.getByRole('button', { name: 'Remove grace' }));
    expect(confirm).toHaveBeenCalledWith(expect.stringMatching(/Remove grace from Acme\?/));
    await waitFor(() => expect(calls('DELETE').map(([url]) => url)).toEqual(['/api/v1/members/2/']));
  });

  it('does not remove anyone when the confirmation is declined', async () => {
    renderPage();
    await screen.findAllByTestId('member-row');
    vi.spyOn(window, 'confirm').mockReturnValue(false);
    await userEvent.click(screen.getByRole('button', { name: 'Remove grace' }));
    expect(calls('DELETE')).toHaveLength(0);
  });

  it('shows a non-owner the list read-only', async () => {
    role = 'viewer';
    renderPage();
    const table = await screen.findByTestId('members-table');
    await screen.findByTestId('members-read-only');
    expect(screen.getByTestId('members-read-only')).toHaveTextContent('Only owners change members.');
    expect(within(table).getByText('Member')).toBeInTheDocument();
    expect(screen.queryByRole('form', { name: 'Add member' })).not.toBeInTheDocument();
    expect(screen.queryByRole('combobox')).not.toBeInTheDocument();
    expect(screen.queryByRole('button', { name: /Remove|Leave/ })).not.toBeInTheDocument();
  });

  it("shows the server's message when adding fails", async () => {
    renderPage();
    await screen.findByRole('form', { name: 'Add member' });
    await userEvent.type(screen.getByLabelText('Username'), 'nobody');
    await userEvent.selectOptions(screen.getByLabelText('Role'), 'viewer');
    await userEvent.click(screen.getByRole('button', { name: 'Add member' }));
    expect(await screen.findByRole('alert')).toHaveTextContent('No user has that name; they sign up first, then you add them.');
    const [, init] = calls('POST')[0];
    expect(JSON.parse(String(init?.body))).toEqual({ username: 'nobody', role: 'viewer' });
    expect((init?.headers as Record<string, string>)['X-CSRFToken']).toBe('tok');
  });

  it("shows the server's message next to the row when a role change is refused", async () => {
    renderPage();
    await screen.findAllByTestId('member-row');
    await userEvent.selectOptions(screen.getByLabelText('Role of ada'), 'viewer');
    await userEvent.click(screen.getByRole('button', { name: 'Save role of ada' }));
    const error = await screen.findByTestId('member-row-error');
    expect(error).toHaveTextContent('An organization keeps at least one owner.');
    // The select shows the role the member still has.
    expect(screen.getByLabelText('Role of ada')).toHaveValue('owner');
  });
});
