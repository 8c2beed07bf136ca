import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { ensureCsrf } from './api/client';
import { App, makeQueryClient } from './App';
import './styles.css';

// The CSRF cookie must exist before the first unsafe request (sign-in included).
void ensureCsrf();

createRoot(document.getElementById('root') as HTMLElement).render(
  <StrictMode>
    <App client={makeQueryClient()} />
  </StrictMode>,
);
