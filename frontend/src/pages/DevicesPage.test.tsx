import { describe, expect, it } from 'vitest';
import { upCommand } from './DevicesPage';

describe('device set-up commands', () => {
  it('turns the server register command into the one that registers and runs', () => {
    expect(upCommand('kiln-agent register --server https://kiln.example --registration-token kiln_reg_x --name $(hostname)')).toBe(
      'kiln-agent up --server https://kiln.example --registration-token kiln_reg_x --name $(hostname)',
    );
    // Nothing but the leading sub-command changes, even if a value says "register".
    expect(upCommand('kiln-agent register --server https://register.example')).toBe('kiln-agent up --server https://register.example');
  });
});
