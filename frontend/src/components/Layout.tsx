/** The signed-in frame: navigation, organization switcher, the user's menu, and the page. */
import { useEffect, useId, useState } from 'react';
import { Navigate, NavLink, Outlet, useLocation, useNavigate } from 'react-router';
import { useLogout, useMe, useSwitchOrganization } from '../api/hooks';
import { ErrorMessage, Loading } from './common';

const NAV = [
  { to: '/models', label: 'Models' },
  { to: '/datasets', label: 'Datasets' },
  { to: '/deployments', label: 'Deployments' },
  { to: '/performance', label: 'Performance' },
  { to: '/compare', label: 'Compare' },
  { to: '/devices', label: 'Devices' },
  { to: '/settings/tokens', label: 'API tokens' },
  { to: '/members', label: 'Members' },
];

function OrganizationSwitcher() {
  const me = useMe().data;
  const switchOrganization = useSwitchOrganization();
  const id = useId();
  if (!me) return null;
  const organizations = me.organizations ?? [];
  return (
    <div className="org-switcher">
      <label htmlFor={id} className="small muted">
        Organization
      </label>
      <select
        id={id}
        data-testid="org-switcher"
        value={me.organization?.id ?? ''}
        disabled={switchOrganization.isPending || organizations.length < 2}
        onChange={(event) =>
          switchOrganization.mutate(Number(event.target.value))
        }
      >
        {organizations.map((organization) => (
          <option key={organization.id} value={organization.id}>
            {organization.name} ({organization.role})
          </option>
        ))}
      </select>
      <ErrorMessage error={switchOrganization.error} />
    </div>
  );
}

export function Layout() {
  const me = useMe();
  const logout = useLogout();
  const navigate = useNavigate();
  const location = useLocation();
  // Below the breakpoint the navigation folds into a menu; following a link closes it.
  const [menuOpen, setMenuOpen] = useState(false);
  const menuId = useId();
  useEffect(() => setMenuOpen(false), [location.pathname]);

  if (me.isPending) return <Loading label="Checking your session…" />;
  if (me.isError) {
    return (
      <main className="center-page">
        <ErrorMessage error={me.error} title="Kiln could not load your session." />
        <button type="button" className="button" onClick={() => me.refetch()}>
          Try again
        </button>
      </main>
    );
  }
  if (!me.data) {
    const next = location.pathname + location.search;
    return <Navigate to={`/login${next && next !== '/' ? `?next=${encodeURIComponent(next)}` : ''}`} replace />;
  }

  return (
    <div className="shell">
      <a className="skip-link" href="#main">
        Skip to content
      </a>
      <aside className={`sidebar${menuOpen ? ' menu-open' : ''}`}>
        <div className="sidebar-top">
          <div className="brand">
            <span className="brand-mark" aria-hidden="true" />
            Kiln
          </div>
          <button
            type="button"
            className="button button-small menu-toggle"
            aria-expanded={menuOpen}
            aria-controls={menuId}
            onClick={() => setMenuOpen((open) => !open)}
            data-testid="menu-toggle"
          >
            {menuOpen ? 'Close menu' : 'Menu'}
          </button>
        </div>
        <div className="sidebar-panel" id={menuId}>
        <OrganizationSwitcher />
        <nav aria-label="Main">
          <ul>
            {NAV.map((item) => (
              <li key={item.to}>
                <NavLink to={item.to} className={({ isActive }) => `nav-link${isActive ? ' active' : ''}`}>
                  {item.label}
                </NavLink>
              </li>
            ))}
          </ul>
        </nav>
        {/* The documentation this server serves (make docs), outside the app's routes: a plain link. */}
        <a className="nav-link nav-docs" href="/docs/" target="_blank" rel="noopener" data-testid="docs-link">
          Documentation
        </a>
        <div className="sidebar-footer">
          <span className="small muted" data-testid="current-user">
            Signed in as <strong>{me.data.user.username}</strong>
          </span>
          <button
            type="button"
            className="button button-small button-ghost"
            onClick={() => logout.mutate(undefined, { onSettled: () => navigate('/login') })}
            disabled={logout.isPending}
          >
            Sign out
          </button>
        </div>
        </div>
      </aside>
      <main id="main" className="content" tabIndex={-1}>
        {me.data.organization?.role === 'viewer' ? (
          <div className="alert alert-warn" data-testid="viewer-notice">
            You are a viewer in {me.data.organization.name}: you can look at everything but not change it.
          </div>
        ) : null}
        {me.data.organization ? (
          <Outlet />
        ) : (
          <ErrorMessage error="You are not a member of any organization yet. Ask an owner to invite you." />
        )}
      </main>
    </div>
  );
}
