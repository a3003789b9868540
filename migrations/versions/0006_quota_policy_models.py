"""quota policies per base model

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 10:00:00.000000

A policy may name one served base model (`model`): it counts that model's requests only, beside
the all-models policy (model NULL, every policy before this revision). The unique constraint
grows to (tenant_id, api_key_id, model).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('quota_policies') as batch:
        batch.add_column(sa.Column('model', sa.String(length=256), nullable=True))
        batch.drop_constraint('uq_quota_policies_tenant_id', type_='unique')
        batch.create_unique_constraint(
            'uq_quota_policies_tenant_id', ['tenant_id', 'api_key_id', 'model']
        )


def downgrade() -> None:
    # 0005 has no place for a model's policy: those go; the all-models policies stay as they are.
    op.execute('DELETE FROM quota_policies WHERE model IS NOT NULL')
    with op.batch_alter_table('quota_policies') as batch:
        batch.drop_constraint('uq_quota_policies_tenant_id', type_='unique')
        batch.create_unique_constraint('uq_quota_policies_tenant_id', ['tenant_id', 'api_key_id'])
        batch.drop_column('model')
