"""spend: prices per model and adapter, each usage row's cost, currency budgets

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 13:25:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('prices',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=False),
    sa.Column('adapter_id', sa.String(length=36), nullable=True),
    sa.Column('prompt_micros_per_mtok', sa.BigInteger(), nullable=False),
    sa.Column('cached_micros_per_mtok', sa.BigInteger(), nullable=False),
    sa.Column('completion_micros_per_mtok', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_prices')),
    sa.UniqueConstraint('model', 'adapter_id', name=op.f('uq_prices_model'))
    )
    # Rows written before prices existed cost nothing: they were never priced.
    with op.batch_alter_table('usage_records') as batch:
        batch.add_column(
            sa.Column('cost_micros', sa.BigInteger(), server_default='0', nullable=False)
        )
    with op.batch_alter_table('quota_policies') as batch:
        batch.add_column(sa.Column('daily_spend_budget_micros', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('monthly_spend_budget_micros', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('quota_policies') as batch:
        batch.drop_column('monthly_spend_budget_micros')
        batch.drop_column('daily_spend_budget_micros')
    with op.batch_alter_table('usage_records') as batch:
        batch.drop_column('cost_micros')
    op.drop_table('prices')
