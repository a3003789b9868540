"""adapter versions, aliases and the content-addressed store

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 16:20:00.000000

Each existing adapter becomes version 1 of its name, with an alias of that name pointing at it,
so every `model` a client used before still resolves to the same weights.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('adapters') as batch:
        batch.add_column(sa.Column('version', sa.Integer(), server_default='1', nullable=False))
        batch.drop_constraint('uq_adapters_owner_tenant_id', type_='unique')
        batch.create_unique_constraint(
            'uq_adapters_owner_tenant_id', ['owner_tenant_id', 'name', 'version']
        )
        batch.alter_column('storage_path', existing_type=sa.String(length=1024), nullable=True)

    op.create_table('adapter_blobs',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_adapter_blobs'))
    )
    op.create_table('adapter_aliases',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('owner_tenant_id', sa.String(length=36), nullable=True),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('version_id', sa.String(length=36), nullable=False),
    sa.Column('canary_version_id', sa.String(length=36), nullable=True),
    sa.Column('canary_weight', sa.Integer(), server_default='0', nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['owner_tenant_id'], ['tenants.id'], name=op.f('fk_adapter_aliases_owner_tenant_id_tenants'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['version_id'], ['adapters.id'], name=op.f('fk_adapter_aliases_version_id_adapters'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['canary_version_id'], ['adapters.id'], name=op.f('fk_adapter_aliases_canary_version_id_adapters'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_adapter_aliases')),
    sa.UniqueConstraint('owner_tenant_id', 'name', name=op.f('uq_adapter_aliases_owner_tenant_id'))
    )
    with op.batch_alter_table('adapter_aliases') as batch:
        batch.create_index(batch.f('ix_adapter_aliases_owner_tenant_id'), ['owner_tenant_id'], unique=False)
    with op.batch_alter_table('usage_records') as batch:
        batch.add_column(sa.Column('adapter_version', sa.Integer(), nullable=True))

    # NULLs are distinct in the unique constraints: public rows get partial unique indexes.
    public = sa.text('owner_tenant_id IS NULL')
    op.create_index('uq_adapters_public_version', 'adapters', ['name', 'version'], unique=True,
                    sqlite_where=public, postgresql_where=public)
    op.create_index('uq_adapter_aliases_public_name', 'adapter_aliases', ['name'], unique=True,
                    sqlite_where=public, postgresql_where=public)

    conn = op.get_bind()
    rows = conn.execute(sa.text('SELECT id, owner_tenant_id, name FROM adapters')).fetchall()
    aliases = sa.table(
        'adapter_aliases',
        sa.column('id', sa.String), sa.column('owner_tenant_id', sa.String),
        sa.column('name', sa.String), sa.column('version_id', sa.String),
        sa.column('canary_weight', sa.Integer), sa.column('updated_at', sa.DateTime(timezone=True)),
    )  # fmt: skip
    now = sa.func.now() if conn.dialect.name == 'postgresql' else sa.func.current_timestamp()
    for adapter_id, owner, name in rows:
        conn.execute(aliases.insert().values(
            id=str(uuid.uuid4()), owner_tenant_id=owner, name=name, version_id=adapter_id,
            canary_weight=0, updated_at=now,
        ))  # fmt: skip


def downgrade() -> None:
    with op.batch_alter_table('usage_records') as batch:
        batch.drop_column('adapter_version')
    op.drop_index('uq_adapter_aliases_public_name', table_name='adapter_aliases')
    op.drop_index('uq_adapters_public_version', table_name='adapters')
    with op.batch_alter_table('adapter_aliases') as batch:
        batch.drop_index(batch.f('ix_adapter_aliases_owner_tenant_id'))
    op.drop_table('adapter_aliases')
    op.drop_table('adapter_blobs')
    # Versions beyond the first cannot keep their names under the old one-name constraint.
    op.execute('DELETE FROM adapters WHERE version > 1')
    # Adapters whose bytes lived in adapter_blobs (dropped above) have no files to point at:
    # an empty path keeps the row (and its usage history's reference), not loadable.
    op.execute("UPDATE adapters SET storage_path = '' WHERE storage_path IS NULL")
    with op.batch_alter_table('adapters') as batch:
        batch.alter_column('storage_path', existing_type=sa.String(length=1024), nullable=False)
        batch.drop_constraint('uq_adapters_owner_tenant_id', type_='unique')
        batch.create_unique_constraint('uq_adapters_owner_tenant_id', ['owner_tenant_id', 'name'])
        batch.drop_column('version')
