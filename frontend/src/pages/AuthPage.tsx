/** Sign in and sign up: the only pages an anonymous visitor sees. */
import { useState, type FormEvent } from 'react';
import { Link, Navigate, useNavigate, useSearchParams } from 'react-router';
import { useLogin, useMe, useSignup } from '../api/hooks';
import { ErrorMessage, Loading, useDocumentTitle } from '../components/common';

function safeNext(next: string | null): string {
  // Only same-site paths, so a crafted link cannot send a fresh session elsewhere.
  return next && next.startsWith('/') && !next.startsWith('//') ? next : '/models';
}

/** The server's password rules (settings.AUTH_PASSWORD_VALIDATORS), checked as the user types. */
export const PASSWORD_MIN_LENGTH = 8;

export function passwordProblems(password: string): string[] {
  // The common-password list lives on the server; its answer comes back next to this field.
  return password.length < PASSWORD_MIN_LENGTH ? [`at least ${PASSWORD_MIN_LENGTH} characters (${password.length} so far)`] : [];
}

export function AuthPage({ mode }: { mode: 'login' | 'signup' }) {
  const me = useMe();
  const [params] = useSearchParams();
  const navigate = useNavigate();
  const login = useLogin();
  const signup = useSignup();
  const [username, setUsername] = useState('');
  const [password, setPassword] = useState('');
  const [organization, setOrganization] = useState('');
  const next = safeNext(params.get('next'));
  const mutation = mode === 'login' ? login : signup;
  useDocumentTitle(mode === 'login' ? 'Sign in' : 'Create an account');
  const problems = mode === 'signup' ? passwordProblems(password) : [];

  if (me.isPending) return <Loading />;
  if (me.data) return <Navigate to={next} replace />;

  const submit = (event: FormEvent) => {
    event.preventDefault();
    const done = { onSuccess: () => navigate(next, { replace: true }) };
    if (mode === 'login') login.mutate({ username, password }, done);
    else signup.mutate({ username, password, organization }, done);
  };

  return (
    <main className="center-page">
      <div className="auth-card card">
        <div className="brand brand-large">
          <span className="brand-mark" aria-hidden="true" />
          Kiln
        </div>
        <h1>{mode === 'login' ? 'Sign in' : 'Create an account'}</h1>
        <form onSubmit={submit} className="form" aria-label={mode === 'login' ? 'Sign in' : 'Sign up'}>
          <div className="field">
            <label htmlFor="auth-username">Username</label>
            <input
              id="auth-username"
              name="username"
              autoComplete="username"
              required
              autoFocus
              value={username}
              onChange={(event) => setUsername(event.target.value)}
            />
          </div>
          <div className="field">
            <label htmlFor="auth-password">Password</label>
            <input
              id="auth-password"
              name="password"
              type="password"
              autoComplete={mode === 'login' ? 'current-password' : 'new-password'}
              required
              value={password}
              onChange={(event) => setPassword(event.target.value)}
              aria-describedby={mode === 'signup' ? 'password-rules' : undefined}
            />
            {mode === 'signup' ? (
              <p id="password-rules" className={`small ${password && problems.length === 0 ? 'field-ok' : 'muted'}`} data-testid="password-rules">
                {password && problems.length === 0
                  ? '✓ Long enough. It must also not be a commonly used password.'
                  : `Password rules: at least ${PASSWORD_MIN_LENGTH} characters, and not a commonly used password.`}
                {password && problems.length > 0 ? <span className="field-error"> Still needs: {problems.join('; ')}.</span> : null}
              </p>
            ) : null}
          </div>
          {mode === 'signup' ? (
            <div className="field">
              <label htmlFor="auth-organization">Organization name</label>
              <input
                id="auth-organization"
                name="organization"
                required
                value={organization}
                onChange={(event) => setOrganization(event.target.value)}
              />
              <p className="muted small">You will own this organization and can invite others later.</p>
            </div>
          ) : null}
          <ErrorMessage error={mutation.error} />
          <button type="submit" className="button button-primary button-block" disabled={mutation.isPending}>
            {mutation.isPending ? 'Please wait…' : mode === 'login' ? 'Sign in' : 'Create account'}
          </button>
        </form>
        <p className="muted small auth-switch">
          {mode === 'login' ? (
            <>
              New to Kiln? <Link to="/signup">Create an account</Link>
            </>
          ) : (
            <>
              Already have an account? <Link to="/login">Sign in</Link>
            </>
          )}
        </p>
      </div>
    </main>
  );
}
