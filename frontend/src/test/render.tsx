/** What page tests share: a fresh query client (no retries), routes in memory, JSON responses, the signed-in user. */
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { render } from '@testing-library/react';
import type { ReactElement } from 'react';
import { createMemoryRouter, RouterProvider, type RouteObject } from 'react-router';
import type { Role } from '../api/types';

/** A fetch Response with `body` as JSON (no body for null, as a 204 has none). */
export function json(body: unknown, status = 200): Response {
  return new Response(body === null ? null : JSON.stringify(body), { status });
}

/** `/api/v1/auth/me/` for ada, with the given role in her one organization, Acme. */
export function meResponse(role: Role = 'owner'): Response {
  const organization = { id: 1, name: 'Acme', slug: 'acme', role };
  return json({ user: { id: 1, username: 'ada' }, organization, organizations: [organization] });
}

/** Render `ui` under its own query client, so no test sees another's cache; failed queries are not retried. */
export function renderWithClient(ui: ReactElement) {
  const client = new QueryClient({ defaultOptions: { queries: { retry: false } } });
  return render(<QueryClientProvider client={client}>{ui}</QueryClientProvider>);
}

/** Render `routes` in a memory router opened at `initialEntry`. */
export function renderRoutes(routes: RouteObject[], initialEntry: string) {
  return renderWithClient(<RouterProvider router={createMemoryRouter(routes, { initialEntries: [initialEntry] })} />);
}
