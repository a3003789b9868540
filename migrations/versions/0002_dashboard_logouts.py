"""dashboard logouts: sessions ended on the server before their expiry

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('dashboard_logouts',
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('session_id', name=op.f('pk_dashboard_logouts'))
    )
    op.create_index(op.f('ix_dashboard_logouts_expires_at'), 'dashboard_logouts', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_dashboard_logouts_expires_at'), table_name='dashboard_logouts')
    op.drop_table('dashboard_logouts')
